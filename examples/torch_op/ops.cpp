// torch.ops.fastkernel_example.add(x, y): a custom op whose CUDA implementation launches the
// Triton kernel `add_kernel` from a fastkernel bundle (exported by add_kernel.py) with no Python
// at run time. A Meta implementation gives torch.compile the output's shape.
#include <fastkernel/fastkernel.h>
#include <fastkernel/torch.h>

#include <ATen/ATen.h>
#include <torch/library.h>

#include <memory>
#include <mutex>
#include <string>

namespace {

// The BLOCK constexpr add_kernel.py exports the kernel with.
constexpr int64_t kBlock = 1024;

std::mutex g_mutex;
std::shared_ptr<fastkernel::Bundle> g_bundle;

void load_bundle(const std::string& directory) {
  auto bundle = std::make_shared<fastkernel::Bundle>(fastkernel::Bundle::load(directory));
  std::lock_guard<std::mutex> lock(g_mutex);
  g_bundle = std::move(bundle);
}

std::shared_ptr<fastkernel::Bundle> bundle() {
  std::lock_guard<std::mutex> lock(g_mutex);
  TORCH_CHECK(g_bundle,
              "fastkernel_example::add: call torch.ops.fastkernel_example.load_bundle first");
  return g_bundle;
}

void check_inputs(const at::Tensor& x, const at::Tensor& y) {
  TORCH_CHECK(x.sizes() == y.sizes(), "fastkernel_example::add: x and y differ in shape");
  TORCH_CHECK(x.scalar_type() == y.scalar_type(),
              "fastkernel_example::add: x and y differ in dtype");
  TORCH_CHECK(x.numel() < (int64_t(1) << 31), "fastkernel_example::add: too many elements");
}

at::Tensor add_cuda(const at::Tensor& x, const at::Tensor& y) {
  check_inputs(x, y);
  const at::Tensor xc = x.contiguous(), yc = y.contiguous();
  at::Tensor out = at::empty_like(xc);
  const int64_t n = xc.numel();
  if (n == 0) {
    return out;
  }
  // On torch's current stream of x's device; the bundle picks the entry for these pointers'
  // alignment and dtype, or throws listing what it has.
  fastkernel::launch(*bundle(), "add_kernel", {unsigned((n + kBlock - 1) / kBlock), 1, 1},
                     {xc, yc, out, n});
  return out;
}

at::Tensor add_meta(const at::Tensor& x, const at::Tensor& y) {
  check_inputs(x, y);
  return at::empty_like(x, x.options().memory_format(at::MemoryFormat::Contiguous));
}

}  // namespace

TORCH_LIBRARY(fastkernel_example, m) {
  m.def("load_bundle(str directory) -> ()", &load_bundle);
  m.def("add(Tensor x, Tensor y) -> Tensor");
}

TORCH_LIBRARY_IMPL(fastkernel_example, CUDA, m) { m.impl("add", &add_cuda); }

TORCH_LIBRARY_IMPL(fastkernel_example, Meta, m) { m.impl("add", &add_meta); }
