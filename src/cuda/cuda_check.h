// cudaError_t -> Status, for the .cu files of this room.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "sparq/status.h"

namespace sparq::cuda {

inline Status CudaStatus(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return Status::Ok();
  return Internal(what + ": CUDA error " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

}  // namespace sparq::cuda
