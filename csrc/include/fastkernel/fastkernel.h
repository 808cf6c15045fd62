// fastkernel's exported C++ API: the specialization key, the launch record and table, the
// trampoline and the run-time driver loader. This is the only header C++ callers include.
//
// \code
//   #include <fastkernel/fastkernel.h>
//   fastkernel::LaunchRecord rec;               // filled from a registered Triton kernel
//   rec.kernel_name = "add_kernel"; rec.block_x = 128; rec.device = 0;
//   rec.plan = {{0, fastkernel::ParamType::Pointer}, {1, fastkernel::ParamType::I32}};
//   fastkernel::load_launch_record(rec, cubin.data(), cubin.size());
//   fastkernel::ArgValue args[2];
//   args[0].kind = fastkernel::ArgKind::Tensor; args[0].u = ptr;
//   args[1].kind = fastkernel::ArgKind::Int; args[1].width = fastkernel::IntWidth::I32; args[1].i =
//   n; fastkernel::launch(rec, {blocks, 1, 1}, stream, args, 0, 0);
// \endcode
#pragma once

#include "fastkernel/bundle.h"
#include "fastkernel/cuda_driver.h"
#include "fastkernel/launch_record.h"
#include "fastkernel/launch_table.h"
#include "fastkernel/specialization.h"
#include "fastkernel/trampoline.h"
