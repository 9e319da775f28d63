/* The packed <-> padded conversions and the batched row gathers / scatters on the CPU, as
 * plain C over bytes.
 *
 * nestbatch compiles it on first use, inside the Python module of csrc/host_module.c
 * (nestbatch/kernels/host_library.py), with the system's C compiler: no torch headers, so it
 * builds in a fraction of a second and works with every torch release. Where no compiler or no
 * Python headers exist the conversions run on their PyTorch implementation.
 *
 * Why not aten's or FBGEMM's kernels: they cost 10-15 us of fixed work per call (dispatch,
 * per-element index arithmetic), and aten's copies run parallel regions, which stall for a
 * scheduler time slice when the machine's cores are busy with other processes. Here a
 * conversion is one memcpy per sample plus one fill per sample's padding, on the calling thread
 * only, so its time follows the bytes moved and degrades as the CPU share does.
 *
 * Rows are opaque: `row_bytes` bytes each (the product of the feature dims times the element
 * size), so one function serves every dtype. Offsets come as int64 or int32 (suffix _i64 /
 * _i32). Every function checks the offsets first and writes nothing when they are outside its
 * contract, returning -1: the caller then runs the PyTorch implementation, which defines the
 * behaviour of such inputs (raising, or truncating).
 */
#include <stdint.h>
#include <string.h>

/* Fill `bytes` bytes at `dst` with copies of the `row_bytes`-byte `pattern` (NULL: zeros). */
static void fill_rows(char *dst, int64_t bytes, const char *pattern, int64_t row_bytes) {
  if (bytes <= 0) return;
  if (pattern == NULL) {
    memset(dst, 0, (size_t)bytes);
    return;
  }
  int64_t done = row_bytes < bytes ? row_bytes : bytes;
  memcpy(dst, pattern, (size_t)done);
  while (done < bytes) { /* doubling: log(rows) memcpy calls */
    int64_t step = done < bytes - done ? done : bytes - done;
    memcpy(dst + done, dst, (size_t)step);
    done += step;
  }
}

#define DEFINE_CONVERSIONS(SUFFIX, INDEX)                                                      \
  /* Whether every sample's length offsets[b + 1] - offsets[b] lies in [0, width]. */         \
  static int lengths_fit_##SUFFIX(const INDEX *offsets, int64_t batch, int64_t width) {      \
    for (int64_t b = 0; b < batch; ++b) {                                                    \
      int64_t n = (int64_t)offsets[b + 1] - (int64_t)offsets[b];                             \
      if (n < 0 || n > width) return 0;                                                      \
    }                                                                                        \
    return 1;                                                                                \
  }                                                                                          \
                                                                                             \
  /* (total, row) packed -> (batch, width, row) padded. Contract: offsets non-decreasing,    \
   * within [0, total], no sample longer than width. */                                     \
  int nb_packed_to_padded_##SUFFIX(const char *values, int64_t total, const INDEX *offsets,  \
                                   int64_t batch, int64_t width, int64_t row_bytes,          \
                                   const char *pattern, char *out) {                         \
    if (batch > 0 && (offsets[0] < 0 || offsets[batch] > total)) return -1;                  \
    if (!lengths_fit_##SUFFIX(offsets, batch, width)) return -1;                            \
    const int64_t sample_bytes = width * row_bytes;                                          \
    for (int64_t b = 0; b < batch; ++b) {                                                    \
      const int64_t start = offsets[b], n = (int64_t)offsets[b + 1] - start;                 \
      char *dst = out + b * sample_bytes;                                                    \
      if (n) memcpy(dst, values + start * row_bytes, (size_t)(n * row_bytes));               \
      fill_rows(dst + n * row_bytes, sample_bytes - n * row_bytes, pattern, row_bytes);      \
    }                                                                                        \
    return 0;                                                                                \
  }                                                                                          \
                                                                                             \
  /* (batch, width, row) padded -> (total, row) packed. Contract: offsets start at 0, end at \
   * total, and no sample is longer than width. */                                          \
  int nb_padded_to_packed_##SUFFIX(const char *data, int64_t batch, int64_t width,           \
                                   int64_t row_bytes, const INDEX *offsets, int64_t total,   \
                                   char *out) {                                              \
    if (offsets[0] != 0 || offsets[batch] != total) return -1;                               \
    if (!lengths_fit_##SUFFIX(offsets, batch, width)) return -1;                            \
    const int64_t sample_bytes = width * row_bytes;                                          \
    for (int64_t b = 0; b < batch; ++b) {                                                    \
      const int64_t start = offsets[b], n = (int64_t)offsets[b + 1] - start;                 \
      if (n) memcpy(out + start * row_bytes, data + b * sample_bytes, (size_t)(n * row_bytes)); \
    }                                                                                        \
    return 0;                                                                                \
  }                                                                                          \
                                                                                             \
  /* (batch, width, row) -> the same with slots >= sizes[b] (clamped to [0, width]) holding  \
   * the pattern: one pass, each output row written once. */                                \
  int nb_fill_padding_##SUFFIX(const char *data, int64_t batch, int64_t width,               \
                               int64_t row_bytes, const INDEX *sizes, const char *pattern,   \
                               char *out) {                                                  \
    const int64_t sample_bytes = width * row_bytes;                                          \
    for (int64_t b = 0; b < batch; ++b) {                                                    \
      int64_t n = sizes[b] < 0 ? 0 : (sizes[b] > width ? width : (int64_t)sizes[b]);         \
      char *dst = out + b * sample_bytes;                                                    \
      if (n) memcpy(dst, data + b * sample_bytes, (size_t)(n * row_bytes));                  \
      fill_rows(dst + n * row_bytes, sample_bytes - n * row_bytes, pattern, row_bytes);      \
    }                                                                                        \
    return 0;                                                                                \
  }                                                                                          \
                                                                                             \
  /* out[b, j] = data[b, indices[b, j]] for j < sizes[b] (clamped to [0, width]), the pattern \
   * elsewhere; data (batch, n, row), indices (batch, width). Contract: valid indices in     \
   * [0, n). */                                                                              \
  int nb_gather_rows_##SUFFIX(const char *data, int64_t batch, int64_t n, int64_t row_bytes, \
                              const INDEX *indices, int64_t width, const INDEX *sizes,       \
                              const char *pattern, char *out) {                              \
    for (int64_t b = 0; b < batch; ++b) {                                                    \
      const int64_t valid = sizes[b] < 0 ? 0 : (sizes[b] > width ? width : (int64_t)sizes[b]); \
      char *dst = out + b * width * row_bytes;                                               \
      for (int64_t j = 0; j < valid; ++j) {                                                  \
        const int64_t i = indices[b * width + j];                                            \
        if (i < 0 || i >= n) return -1;                                                      \
        memcpy(dst + j * row_bytes, data + (b * n + i) * row_bytes, (size_t)row_bytes);      \
      }                                                                                      \
      fill_rows(dst + valid * row_bytes, (width - valid) * row_bytes, pattern, row_bytes);   \
    }                                                                                        \
    return 0;                                                                                \
  }                                                                                          \
                                                                                             \
  /* out[b, targets[b, j]] = source[b, sources[b, j]] (sources NULL: slot j) for            \
   * j < sizes[b] (clamped), in slot order (a repeated target keeps the last); out          \
   * (batch, target_n, row) holds what the other slots keep. Contract: indices in range. */ \
  int nb_scatter_rows_##SUFFIX(const char *source, int64_t source_n, const INDEX *sources,   \
                               const INDEX *targets, int64_t target_n, const INDEX *sizes,   \
                               int64_t batch, int64_t width, int64_t row_bytes, char *out) { \
    for (int64_t b = 0; b < batch; ++b) {                                                    \
      const int64_t valid = sizes[b] < 0 ? 0 : (sizes[b] > width ? width : (int64_t)sizes[b]); \
      for (int64_t j = 0; j < valid; ++j) {                                                  \
        const int64_t s = sources ? (int64_t)sources[b * width + j] : j;                     \
        const int64_t t = targets[b * width + j];                                            \
        if (s < 0 || s >= source_n || t < 0 || t >= target_n) return -1;                     \
        memcpy(out + (b * target_n + t) * row_bytes, source + (b * source_n + s) * row_bytes, \
               (size_t)row_bytes);                                                           \
      }                                                                                      \
    }                                                                                        \
    return 0;                                                                                \
  }

DEFINE_CONVERSIONS(i64, int64_t)
DEFINE_CONVERSIONS(i32, int32_t)
