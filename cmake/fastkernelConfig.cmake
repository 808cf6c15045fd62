# find_package(fastkernel) for C++ callers: the exported API (headers) and the native core
# (driver loader, launch records and table, trampoline, bundles) as fastkernel::fastkernel, and
# fastkernel::torch (torch's headers, c10 and torch_cpu, from the torch this package was built
# against) for callers of fastkernel/torch.h. Neither needs a CUDA toolkit: the driver is opened
# at run time. Installed with the wheel; fastkernel.get_cmake_dir() prints this directory.
get_filename_component(_fastkernel_root "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET fastkernel::fastkernel)
  add_library(fastkernel::fastkernel STATIC IMPORTED)
  set_target_properties(fastkernel::fastkernel PROPERTIES
    IMPORTED_LOCATION "${_fastkernel_root}/lib/libfastkernel_core.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_fastkernel_root}/include"
    INTERFACE_LINK_LIBRARIES "${CMAKE_DL_LIBS}"
    INTERFACE_COMPILE_FEATURES cxx_std_17)
endif()
include("${CMAKE_CURRENT_LIST_DIR}/fastkernelTorchPaths.cmake")
include("${CMAKE_CURRENT_LIST_DIR}/fastkernelTorch.cmake")
set(fastkernel_INCLUDE_DIR "${_fastkernel_root}/include")
set(fastkernel_FOUND TRUE)
