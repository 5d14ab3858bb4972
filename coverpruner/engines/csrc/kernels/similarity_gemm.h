// Cosine-similarity GEMM of the CUDA coverage selector: M[b] = Vn[b] Vn[b]^T for a batch.
// Host C++ around cuBLAS, kept apart from the kernels so those compile with the CUDA toolkit alone.
#pragma once

#include <string>

namespace coverpruner
{

// normalized: [batch, n, d] float16 (fp16 == true) or float32, row-major, device; sim: [batch, n, n]
// float32 device output. Accumulation is float32 for both input types. cublas: a cublasHandle_t or
// nullptr for the library's handle of (current device, stream); stream: a cudaStream_t. Returns CP_OK or
// CP_ERR_CUBLAS with *error set.
int similarity_gemm(void* cublas, void* stream, void const* normalized, bool fp16, int batch, int n, int d,
    float* sim, std::string* error);

// A caller-owned handle on the current device (cp_cublas_create / cp_cublas_destroy).
int create_handle(void** handle, std::string* error);
void destroy_handle(void* handle);

// Destroys the handles similarity_gemm created (cp_release_handles); returns how many.
int release_handles();

} // namespace coverpruner
