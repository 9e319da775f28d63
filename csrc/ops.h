// Host entry points of the nestbatch CUDA operators (registered in bindings.cpp). Shapes and
// semantics are documented on the Python operators in nestbatch/kernels/operators.py.
#pragma once

#include <ATen/core/Tensor.h>

#include <tuple>

namespace nestbatch {

at::Tensor packed_to_padded_cuda(const at::Tensor& values, const at::Tensor& offsets,
                                 int64_t max_len, const at::Scalar& padding_value);
at::Tensor padded_to_packed_cuda(const at::Tensor& data, const at::Tensor& offsets, int64_t total);
at::Tensor fill_padding_cuda(const at::Tensor& data, const at::Tensor& sizes,
                             const at::Scalar& value);

at::Tensor indexing_access_cuda(const at::Tensor& data, const at::Tensor& indices,
                                const at::Tensor& sizes, const at::Scalar& filler_value);
at::Tensor indexing_write_cuda(const at::Tensor& to_write, const at::Tensor& indices,
                               const at::Tensor& sizes, const at::Tensor& into);
at::Tensor inverse_indexing_access_cuda(const at::Tensor& data, const at::Tensor& indices,
                                        const at::Tensor& sizes, int64_t num_targets,
                                        const at::Scalar& filler_value);
at::Tensor index_mapping_cuda(const at::Tensor& source, const at::Tensor& source_indices,
                              const at::Tensor& target_indices, const at::Tensor& sizes,
                              const at::Tensor& target);

std::tuple<at::Tensor, at::Tensor> mask_to_indices_cuda(const at::Tensor& mask,
                                                         int64_t max_count);
at::Tensor indices_to_mask_cuda(const at::Tensor& indices, const at::Tensor& sizes,
                                int64_t num_targets);
std::tuple<at::Tensor, at::Tensor> bool_compaction_cuda(const at::Tensor& data,
                                                        const at::Tensor& mask,
                                                        int64_t max_count);

}  // namespace nestbatch
