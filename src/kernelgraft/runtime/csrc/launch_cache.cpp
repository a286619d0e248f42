#include "launch_cache.h"

#include <cstring>

#include "admit.h"

namespace kgrt {
namespace {

template <typename T>
void append(std::string* key, T value) {
  key->append(reinterpret_cast<const char*>(&value), sizeof value);
}

}  // namespace

bool signature(const OpEntry& op, c10::ArrayRef<c10::IValue> args, bool cuda, std::string* key, c10::Device* device) {
  if (args.size() != op.params.size()) return false;
  bool have_device = false;
  for (size_t i = 0; i < op.params.size(); ++i) {
    const c10::IValue& v = args[i];
    if (op.params[i].kind == "tensor") {
      if (v.isNone()) {
        key->push_back('N');
        continue;
      }
      if (!v.isTensor()) return false;
      const at::Tensor& t = v.toTensor();
      if (unusual(t)) return false;  // the full path refuses it (admit.h)
      if (cuda ? !t.is_cuda() : t.device().type() != c10::kCPU) return false;
      if (have_device && t.device() != *device) return false;
      if (!have_device) {
        *device = t.device();
        have_device = true;
      }
      key->push_back('T');
      append(key, static_cast<int8_t>(t.scalar_type()));
      append(key, static_cast<int8_t>(t.dim()));
      for (int64_t s : t.sizes()) append(key, s);
      for (int64_t s : t.strides()) append(key, s);  // guards and parameters may read them
      key->push_back(reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0 ? 'a' : 'u');
    } else if (v.isBool()) {
      key->push_back(v.toBool() ? 'B' : 'b');
    } else if (v.isInt()) {
      key->push_back('i');
      append(key, static_cast<int64_t>(v.toInt()));
    } else if (v.isDouble()) {
      key->push_back('d');
      append(key, v.toDouble());  // by bits: -0.0 and 0.0, or two NaNs, are two signatures
    } else if (v.isString()) {
      const std::string& s = v.toStringRef();
      key->push_back('s');
      append(key, static_cast<uint64_t>(s.size()));
      key->append(s);
    } else if (v.isNone()) {
      key->push_back('n');
    } else {
      return false;  // a list, a dtype object, ...: not keyed, planned on every call
    }
  }
  if (have_device) append(key, static_cast<int16_t>(device->index()));
  return have_device;
}

std::shared_ptr<const Launch> LaunchCache::find(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = map_.find(key);
  return it == map_.end() ? nullptr : it->second;
}

void LaunchCache::put(const std::string& key, std::shared_ptr<const Launch> launch) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (map_.size() >= kMaxEntries) map_.clear();  // a workload of ever new shapes: plan them all again
  map_[key] = std::move(launch);
}

size_t LaunchCache::size() {
  std::lock_guard<std::mutex> lock(mutex_);
  return map_.size();
}

}  // namespace kgrt
