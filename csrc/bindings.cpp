// Registers the CUDA kernels as operators of the private `nestbatch_cuda` namespace. The public
// `nestbatch::*` operators (nestbatch/kernels/operators.py) dispatch to these on CUDA tensors when
// this extension is loaded, and to their PyTorch implementation otherwise.
#include <torch/extension.h>
#include <torch/library.h>

#include "ops.h"

TORCH_LIBRARY(nestbatch_cuda, m) {
  m.def("packed_to_padded(Tensor values, Tensor offsets, int max_len, Scalar padding_value) -> "
        "Tensor");
  m.def("padded_to_packed(Tensor data, Tensor offsets, int total) -> Tensor");
  m.def("fill_padding(Tensor data, Tensor sizes, Scalar value) -> Tensor");
  m.def("indexing_access(Tensor data, Tensor indices, Tensor sizes, Scalar filler_value) -> "
        "Tensor");
  m.def("indexing_write(Tensor to_write, Tensor indices, Tensor sizes, Tensor into) -> Tensor");
  m.def("inverse_indexing_access(Tensor data, Tensor indices, Tensor sizes, int num_targets, "
        "Scalar filler_value) -> Tensor");
  m.def("index_mapping(Tensor source, Tensor source_indices, Tensor target_indices, "
        "Tensor sizes, Tensor target) -> Tensor");
  m.def("mask_to_indices(Tensor mask, int max_count) -> (Tensor, Tensor)");
  m.def("indices_to_mask(Tensor indices, Tensor sizes, int num_targets) -> Tensor");
  m.def("bool_compaction(Tensor data, Tensor mask, int max_count) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(nestbatch_cuda, CUDA, m) {
  m.impl("packed_to_padded", &nestbatch::packed_to_padded_cuda);
  m.impl("padded_to_packed", &nestbatch::padded_to_packed_cuda);
  m.impl("fill_padding", &nestbatch::fill_padding_cuda);
  m.impl("indexing_access", &nestbatch::indexing_access_cuda);
  m.impl("indexing_write", &nestbatch::indexing_write_cuda);
  m.impl("inverse_indexing_access", &nestbatch::inverse_indexing_access_cuda);
  m.impl("index_mapping", &nestbatch::index_mapping_cuda);
  m.impl("mask_to_indices", &nestbatch::mask_to_indices_cuda);
  m.impl("indices_to_mask", &nestbatch::indices_to_mask_cuda);
  m.impl("bool_compaction", &nestbatch::bool_compaction_cuda);
}

// Importing the module (ahead-of-time build) loads the library, which runs the registrations
// above; it exposes no Python functions of its own.
PYBIND11_MODULE(TORCH_EXTENSION_NAME, module) {
  module.doc() = "nestbatch CUDA kernels (operators in torch.ops.nestbatch_cuda)";
}
