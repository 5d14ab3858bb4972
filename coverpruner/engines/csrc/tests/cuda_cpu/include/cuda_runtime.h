// Emulated CUDA runtime for the CPU tests: see ../cuda_cpu.h.
#pragma once
#include "../cuda_cpu.h"
