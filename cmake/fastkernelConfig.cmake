# find_package(fastkernel) for C++ callers: the exported API (headers) and the native core
# (driver loader, launch records and table, trampoline, bundles) as fastkernel::fastkernel.
# Installed with the wheel; fastkernel.get_cmake_dir() prints this directory.
get_filename_component(_fastkernel_root "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
if(NOT TARGET fastkernel::fastkernel)
  add_library(fastkernel::fastkernel STATIC IMPORTED)
  set_target_properties(fastkernel::fastkernel PROPERTIES
    IMPORTED_LOCATION "${_fastkernel_root}/lib/libfastkernel_core.a"
    INTERFACE_INCLUDE_DIRECTORIES "${_fastkernel_root}/include"
    INTERFACE_LINK_LIBRARIES "${CMAKE_DL_LIBS}"
    INTERFACE_COMPILE_FEATURES cxx_std_17)
endif()
set(fastkernel_INCLUDE_DIR "${_fastkernel_root}/include")
set(fastkernel_FOUND TRUE)
