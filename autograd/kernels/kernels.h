#pragma once
// Every raw-pointer kernel of autograd, for code that calls kernels directly (tests, benchmarks,
// the optimiser's update loops). The conventions are in common.h; the ops in autograd/ops.h and
// autograd/attention.h check shapes, call these and record the backward.
#include "autograd/kernels/attention.h"
#include "autograd/kernels/blas.h"
#include "autograd/kernels/common.h"
#include "autograd/kernels/elementwise.h"
#include "autograd/kernels/embedding.h"
#include "autograd/kernels/layout.h"
#include "autograd/kernels/matmul.h"
#include "autograd/kernels/norms.h"
#include "autograd/kernels/reduce.h"
#include "autograd/kernels/softmax.h"
