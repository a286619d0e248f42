#include "native.h"

#include <dlfcn.h>
#include <sys/mman.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <stdexcept>

#include "crypto.h"
#include "json.h"

namespace kgrt {
namespace {

uint16_t machine() {
#if defined(__x86_64__)
  return 62;
#elif defined(__aarch64__)
  return 183;
#else
  return 0;
#endif
}

// dlopen of exactly `image`, once per process per sha256 (never closed: its code may be running).
void* open_image(const std::string& where, const std::string& image) {
  static std::mutex mutex;
  static std::map<std::string, void*>* opened = new std::map<std::string, void*>();
  std::string digest = sha256_hex(image);
  std::lock_guard<std::mutex> guard(mutex);
  auto found = opened->find(digest);
  if (found != opened->end()) return found->second;
  int fd = static_cast<int>(::memfd_create(("kernelgraft-" + digest.substr(0, 16)).c_str(), MFD_CLOEXEC));
  if (fd < 0) throw std::runtime_error(where + ": memfd_create failed: " + std::strerror(errno));
  size_t done = 0;
  while (done < image.size()) {
    ssize_t n = ::write(fd, image.data() + done, image.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      throw std::runtime_error(where + ": writing the library to memory failed");
    }
    done += static_cast<size_t>(n);
  }
  // The fd stays open for the process: the dynamic loader takes a path it has opened before for
  // the library already loaded, and a closed fd's number (so its /proc path) comes back for the next.
  std::string path = "/proc/self/fd/" + std::to_string(fd);
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    std::string why = dlerror();
    ::close(fd);
    throw std::runtime_error(where + ": the library does not load: " + why);
  }
  (*opened)[digest] = handle;
  return handle;
}

}  // namespace

void check_library(const std::string& where, const std::string& image, bool entry) {
  auto u16 = [&](size_t at) {
    return static_cast<unsigned>(static_cast<unsigned char>(image[at]) | (static_cast<unsigned char>(image[at + 1]) << 8));
  };
  if (image.size() < 64 || image.compare(0, 6, "\x7f" "ELF\x02\x01") != 0 || u16(16) != 3 ||
      (machine() != 0 && u16(18) != machine()))
    throw BundleError(where + ": the library is not a 64-bit ELF shared object for this machine");
  if (entry && image.find(std::string("kg_cutedsl_launch") + '\0') == std::string::npos)
    throw BundleError(where + ": the library does not define kg_cutedsl_launch");
}

NativeFunction::Entry NativeFunction::entry() {
  std::lock_guard<std::mutex> guard(mutex_);
  if (entry_ != nullptr) return entry_;
  open_image(where_ + " (runtime)", *runtime_);
  void* lib = open_image(where_, *library_);
  auto abi = reinterpret_cast<int (*)()>(dlsym(lib, "kg_cutedsl_abi"));
  auto kinds = reinterpret_cast<const char* (*)()>(dlsym(lib, "kg_cutedsl_kinds"));
  auto launch = reinterpret_cast<Entry>(dlsym(lib, "kg_cutedsl_launch"));
  if (abi == nullptr || kinds == nullptr || launch == nullptr)
    throw std::runtime_error(where_ + ": the library lacks the kg_cutedsl_* entry points");
  std::string want;
  for (const auto& k : kinds_) want += (want.empty() ? "" : ",") + k;
  if (abi() != 1 || want != kinds())
    throw std::runtime_error(where_ + ": the library takes [" + kinds() + "] (ABI " + std::to_string(abi()) +
                             "), the manifest says [" + want + "] (ABI 1); the manifest or the library was modified");
  entry_ = launch;
  return entry_;
}

void NativeFunction::launch(int device, void* stream, void** params) {
  Entry f = entry();
  char error[512] = {0};
  int status = f(device, stream, params, static_cast<int>(kinds_.size()), error, sizeof error);
  if (status != 0) throw std::runtime_error(where_ + ": " + error);
}

}  // namespace kgrt
