# fastkernel::torch: torch's C++ headers and the libraries a C++-only user of at::Tensor links
# (c10 and torch_cpu), taken from the installed torch package the way
# torch.utils.cpp_extension builds C++-only extensions (include_paths(), library_paths(), the
# _GLIBCXX_USE_CXX11_ABI value torch was built with). Unlike find_package(Torch), it runs none of
# Caffe2's CUDA detection, so a CUDA build of torch configures and builds with no CUDA toolkit,
# no nvcc and no CUDA_HOME: fastkernel opens the driver with dlopen and reaches torch's stream
# through c10's device-generic interface, so nothing of CUDA is needed at build time.
#
# Inputs (set before including this file):
#   FASTKERNEL_TORCH_INCLUDE_DIRS  torch.utils.cpp_extension.include_paths()
#   FASTKERNEL_TORCH_LIBRARY_DIR   torch.utils.cpp_extension.library_paths()[0] (torch/lib)
#   FASTKERNEL_TORCH_CXX11_ABI     int(torch._C._GLIBCXX_USE_CXX11_ABI)
#   FASTKERNEL_TORCH_VERSION       torch.__version__ (it picks the C++ standard, below)
# Defines fastkernel::torch (headers, c10, torch_cpu) and fastkernel::torch_python (also
# torch_python, for extension modules that take Python tensors).
if(TARGET fastkernel::torch)
  return()
endif()
foreach(_fk_dir IN LISTS FASTKERNEL_TORCH_INCLUDE_DIRS FASTKERNEL_TORCH_LIBRARY_DIR)
  if(NOT IS_DIRECTORY "${_fk_dir}")
    message(FATAL_ERROR "fastkernel: torch directory ${_fk_dir} does not exist; reinstall "
                        "fastkernel against the torch you use (pip install --no-build-isolation .)")
  endif()
endforeach()
foreach(_fk_lib c10 torch_cpu torch_python)
  find_library(FASTKERNEL_TORCH_${_fk_lib}_LIBRARY ${_fk_lib}
               PATHS "${FASTKERNEL_TORCH_LIBRARY_DIR}" NO_DEFAULT_PATH REQUIRED)
endforeach()
add_library(fastkernel::torch INTERFACE IMPORTED)
target_include_directories(fastkernel::torch SYSTEM INTERFACE ${FASTKERNEL_TORCH_INCLUDE_DIRS})
target_compile_definitions(fastkernel::torch INTERFACE
  _GLIBCXX_USE_CXX11_ABI=${FASTKERNEL_TORCH_CXX11_ABI})
target_link_libraries(fastkernel::torch INTERFACE
  "${FASTKERNEL_TORCH_c10_LIBRARY}" "${FASTKERNEL_TORCH_torch_cpu_LIBRARY}")
# The C++ standard torch.utils.cpp_extension compiles this torch's extensions with: C++20 from
# torch 2.13 (pytorch/pytorch#176659), whose headers require it from 2.14 (std::strong_ordering in
# c10/util/intrusive_ptr.h, requires-clauses in ATen/core/TensorBase.h); C++17 before. Whatever
# links fastkernel::torch is compiled with at least that standard.
string(REGEX MATCH "^[0-9]+\\.[0-9]+" _fk_torch_release "${FASTKERNEL_TORCH_VERSION}")
if(NOT _fk_torch_release)
  message(FATAL_ERROR "fastkernel: cannot read a torch release from FASTKERNEL_TORCH_VERSION "
                      "'${FASTKERNEL_TORCH_VERSION}'")
endif()
if(_fk_torch_release VERSION_GREATER_EQUAL 2.13)
  set(FASTKERNEL_TORCH_CXX_STANDARD 20)
else()
  set(FASTKERNEL_TORCH_CXX_STANDARD 17)
endif()
target_compile_features(fastkernel::torch INTERFACE cxx_std_${FASTKERNEL_TORCH_CXX_STANDARD})
add_library(fastkernel::torch_python INTERFACE IMPORTED)
target_link_libraries(fastkernel::torch_python INTERFACE
  fastkernel::torch "${FASTKERNEL_TORCH_torch_python_LIBRARY}")
