// check_manifest: the rules of kernelgraft/aot/bundle_spec.py, walked in the same order and
// naming fields by the same paths as kernelgraft/aot/bundle_check.py. Every count is capped
// before a loop runs over it; constant program parts are evaluated with the runtime's own
// evaluator (program.h). What only the Python loader checks: that each expression text compiles
// to its program (the runtime never reads the texts).
#include "spec.h"

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <set>

#include "spec_walk.h"

namespace kgrt {
namespace spec {
namespace {

using namespace detail;  // NOLINT: the pieces spec_walk.h declares for this walk

const picojson::object& names(const Walk& w, const Json& v, const std::string& path,
                              const std::function<bool(const std::string&)>& allowed, const std::string& what) {
  const auto& o = w.obj(v, path);
  if (static_cast<int64_t>(o.size()) > PARAMS + RETURNS)
    w.fail(path, "has " + std::to_string(o.size()) + " keys, over the cap of " + std::to_string(PARAMS + RETURNS));
  for (const auto& kv : o)
    if (!allowed(kv.first)) w.fail(path, quoted(kv.first) + " is not " + what);
  return o;
}

void check_images(const Walk& w, const picojson::object& images, const std::string& path) {
  for (const auto& kv : images) {
    std::string at = path + "." + kv.first;
    w.one_of(Json(kv.first), at, set_of(kImageKinds));
    const auto& image = w.obj(kv.second, at);
    const std::string& file = w.string(w.field(image, "file", at), at + ".file", NAME_CHARS, "NAME_CHARS");
    if (!bin_file(file)) w.fail(at + ".file", quoted(file) + " is outside the bundle's bin/ (or not a file name)");
    const Json& digest = w.field(image, "sha256", at);
    if (!digest.is<std::string>() || !sha256_hex(digest.get<std::string>())) w.fail(at + ".sha256", "is not a sha256 in hex");
    w.integer(w.field(image, "bytes", at), at + ".bytes", 0, FILE_BYTES);
  }
  if (images.count("so")) {
    if (!images.count("runtime") || images.count("cubin"))
      w.fail(path, "a library (so) comes with its runtime and no cubin");
  } else if (!images.count("cubin") || images.count("runtime")) {
    w.fail(path, "a kernel has a cubin (or a library so with its runtime)");
  }
}

// The manifest's dtypes agree with the types the kernel's compiler recorded.
void check_types(const Walk& w, const picojson::object& k, const picojson::array& kparams,
                 const picojson::object& dtypes, const picojson::array& out_dtypes, const std::string& path) {
  std::map<std::string, std::string> sources;
  for (const auto& kv : dtypes) sources[kv.first] = kv.second.get<std::string>();
  for (size_t i = 0; i < out_dtypes.size(); ++i) sources["out" + std::to_string(i)] = out_dtypes[i].get<std::string>();
  std::vector<std::string> pointers;  // "" where the source has no dtype
  for (const auto& p : kparams) {
    const auto& po = p.get<picojson::object>();
    auto s = po.find("source");
    if (s != po.end()) {
      auto d = sources.find(s->second.get<std::string>());
      pointers.push_back(d == sources.end() ? "" : d->second);
    }
  }
  auto triton = k.find("triton");
  if (triton != k.end() && triton->second.is<picojson::object>() && triton->second.contains("signature") &&
      triton->second.get("signature").is<picojson::object>()) {
    bool known = std::all_of(pointers.begin(), pointers.end(), [](const std::string& d) { return triton_types().count(d) > 0; });
    if (known) {
      std::vector<std::string> compiled, claimed;
      for (const auto& kv : triton->second.get("signature").get<picojson::object>())
        if (kv.second.is<std::string>() && kv.second.get<std::string>().rfind("*", 0) == 0)
          compiled.push_back(kv.second.get<std::string>());
      for (const auto& d : pointers) claimed.push_back("*" + triton_types().at(d));
      std::sort(compiled.begin(), compiled.end());
      std::sort(claimed.begin(), claimed.end());
      if (compiled != claimed) w.fail(path + ".dtypes", "give pointer types other than the kernel was compiled for");
    }
  }
  auto cuda = k.find("cuda");
  if (cuda != k.end() && cuda->second.is<picojson::object>() && cuda->second.contains("template") &&
      cuda->second.get("template").is<picojson::object>()) {
    for (const auto& kv : cuda->second.get("template").get<picojson::object>()) {
      if (!kv.second.is<std::string>()) continue;
      auto want = c_types().find(kv.second.get<std::string>());
      if (want == c_types().end()) continue;
      bool found = false;
      for (const auto& s : sources) found |= s.second == want->second;
      if (!found)
        w.fail(path + ".dtypes", "template argument " + kv.first + "=" + kv.second.get<std::string>() +
                                     " is compiled for " + want->second + ", which no tensor of the kernel has");
    }
  }
}

struct OpShape {
  Kinds kinds;
  std::vector<std::string> params;
  int64_t n_returns;
};

void check_programs(Walk& w, const picojson::object& prog, const std::string& path, const OpShape& op,
                    size_t n_guards, size_t n_params, size_t n_dims_rows, const std::vector<bool>& scalar,
                    const std::vector<size_t>& dims) {
  size_t n = op.params.size();
  // one program per guard text (the kernel serves where all hold): no text is joined to another
  const auto& guards = w.lst(w.field(prog, "guards", path), path + ".guards", GUARDS, "GUARDS",
                             static_cast<int64_t>(n_guards));
  for (size_t i = 0; i < guards.size(); ++i) w.program(guards[i], path + ".guards[" + std::to_string(i) + "]", n);
  const auto& grid = w.lst(w.field(prog, "grid", path), path + ".grid", -1, "", 3);
  for (int d = 0; d < 3; ++d) {
    std::string at = path + ".grid[" + std::to_string(d) + "]";
    Value v;
    if (w.program(grid[d], at, n, &v) && (v.kind != Value::Int || v.i < 1 || v.i > kMaxGrid[d]))
      w.fail(at, describe(v) + " is outside the device limits (1.." + std::to_string(kMaxGrid[d]) + ")");
  }
  Value v;
  if (w.program(w.field(prog, "shared_mem", path), path + ".shared_mem", n, &v) &&
      (v.kind != Value::Int || v.i < 0 || v.i > kMaxShared))
    w.fail(path + ".shared_mem", describe(v) + " bytes is outside 0.." + std::to_string(kMaxShared));
  const auto& params = w.lst(w.field(prog, "params", path), path + ".params", -1, "", static_cast<int64_t>(n_params));
  for (size_t i = 0; i < params.size(); ++i) {
    std::string at = path + ".params[" + std::to_string(i) + "]";
    if (scalar[i] == params[i].is<picojson::null>()) w.fail(at, "a pointer has no program, a scalar has one");
    if (scalar[i]) w.program(params[i], at, n);
  }
  const auto& outputs = w.lst(w.field(prog, "outputs", path), path + ".outputs", -1, "", static_cast<int64_t>(n_dims_rows));
  for (size_t i = 0; i < outputs.size(); ++i) {
    std::string at = path + ".outputs[" + std::to_string(i) + "]";
    const auto& d = w.lst(outputs[i], at, -1, "", static_cast<int64_t>(dims[i]));
    for (size_t j = 0; j < d.size(); ++j) w.program(d[j], at + "[" + std::to_string(j) + "]", n);
  }
}

void check_kernel(Walk& w, const picojson::object& k, const std::string& path, const OpShape& op,
                  const std::set<std::string>& archs) {
  const Kinds& kinds = op.kinds;
  auto tensor = [&](const std::string& n) { auto it = kinds.find(n); return it != kinds.end() && it->second == "tensor"; };
  auto output = [&](const std::string& n) {
    if (n.rfind("out", 0) != 0 || n.size() < 4 || n.size() > 5 || !digits(n, 3) || (n.size() == 5 && n[3] == '0'))
      return false;
    return std::stoll(n.substr(3)) < op.n_returns;
  };
  w.one_of(w.field(k, "arch", path), path + ".arch", archs);
  const std::string& name = w.string(w.field(k, "kernel", path), path + ".kernel", NAME_CHARS, "NAME_CHARS");
  if (name.empty()) w.fail(path + ".kernel", "is empty");
  w.boolean(w.field(k, "dynamic", path), path + ".dynamic");
  const auto& dtypes = names(w, w.field(k, "dtypes", path), path + ".dtypes", tensor, "a tensor parameter");
  for (const auto& kv : dtypes) w.one_of(kv.second, path + ".dtypes." + kv.first, set_of(kDtypes));
  for (const auto& kv : names(w, w.field(k, "ranks", path), path + ".ranks", tensor, "a tensor parameter"))
    w.integer(kv.second, path + ".ranks." + kv.first, 0, DIMS);
  auto pinned = k.find("pinned");
  if (pinned != k.end()) {
    if (w.version() < 3) w.fail(path + ".pinned", "needs manifest version 3");
    auto str = [&](const std::string& n) { auto it = kinds.find(n); return it != kinds.end() && it->second == "str"; };
    for (const auto& kv : names(w, pinned->second, path + ".pinned", str, "a str parameter"))
      w.string(kv.second, path + ".pinned." + kv.first);
  }
  const auto& aligned = w.lst(w.field(k, "aligned", path), path + ".aligned", PARAMS, "PARAMS");
  for (size_t i = 0; i < aligned.size(); ++i) {
    const Json& n = aligned[i];
    bool ok = n.is<std::string>() && (tensor(n.get<std::string>()) || output(n.get<std::string>()) ||
                                      (kinds.count(n.get<std::string>()) && kinds.at(n.get<std::string>()) == "tensor_list"));
    if (!ok) w.fail(path + ".aligned[" + std::to_string(i) + "]", "is not a tensor parameter or output");
  }
  const auto& guards = w.lst(w.field(k, "guards", path), path + ".guards", GUARDS, "GUARDS");
  for (size_t i = 0; i < guards.size(); ++i) w.expr(guards[i], path + ".guards[" + std::to_string(i) + "]");
  const auto& grid = w.lst(w.field(k, "grid", path), path + ".grid", -1, "", 3);
  for (size_t i = 0; i < grid.size(); ++i) w.expr(grid[i], path + ".grid[" + std::to_string(i) + "]");
  w.expr(w.field(k, "shared_mem", path), path + ".shared_mem");
  const auto& block = w.lst(w.field(k, "block", path), path + ".block", -1, "", 3);
  int64_t threads = 1;
  for (int d = 0; d < 3; ++d) threads *= w.integer(block[d], path + ".block[" + std::to_string(d) + "]", 1, kMaxBlock[d]);
  if (threads > kMaxThreads) w.fail(path + ".block", "has " + std::to_string(threads) + " threads, over 1024");
  const auto& kparams = w.lst(w.field(k, "params", path), path + ".params", KERNEL_PARAMS, "KERNEL_PARAMS");
  std::vector<bool> scalar;
  for (size_t i = 0; i < kparams.size(); ++i) {
    std::string at = path + ".params[" + std::to_string(i) + "]";
    const auto& p = w.obj(kparams[i], at);
    const std::string& kind = w.one_of(w.field(p, "kind", at), at + ".kind", set_of(kKernelKinds));
    if (kind == "ptr") {
      auto null = p.find("null");
      bool is_null = null != p.end() && null->second.is<bool>() && null->second.get<bool>();
      if (p.count("expr") || p.count("source") == static_cast<size_t>(is_null))
        w.fail(at, "a pointer has either a source or \"null\": true");
      auto s = p.find("source");
      if (s != p.end() && !(s->second.is<std::string>() && (tensor(s->second.get<std::string>()) || output(s->second.get<std::string>()))))
        w.fail(at + ".source", "is not a tensor parameter or output");
      scalar.push_back(false);
    } else {
      if (p.count("source") || p.count("null")) w.fail(at, "a " + kind + " parameter has an expr, not a source");
      w.expr(w.field(p, "expr", at), at + ".expr");
      scalar.push_back(true);
    }
  }
  const auto& outputs = w.obj(w.field(k, "outputs", path), path + ".outputs");
  const auto& shapes = w.lst(w.field(outputs, "shapes", path + ".outputs"), path + ".outputs.shapes", -1, "", op.n_returns);
  std::vector<size_t> dims;
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::string at = path + ".outputs.shapes[" + std::to_string(i) + "]";
    const auto& s = w.lst(shapes[i], at, DIMS, "DIMS");
    for (size_t j = 0; j < s.size(); ++j) w.expr(s[j], at + "[" + std::to_string(j) + "]");
    dims.push_back(s.size());
  }
  const auto& out_dtypes = w.lst(w.field(outputs, "dtypes", path + ".outputs"), path + ".outputs.dtypes", -1, "", op.n_returns);
  for (size_t i = 0; i < out_dtypes.size(); ++i) w.one_of(out_dtypes[i], path + ".outputs.dtypes[" + std::to_string(i) + "]", set_of(kDtypes));
  check_images(w, w.obj(w.field(k, "images", path), path + ".images"), path + ".images");
  check_types(w, k, kparams, dtypes, out_dtypes, path);
  check_programs(w, w.obj(w.field(k, "program", path), path + ".program"), path + ".program", op, guards.size(),
                 kparams.size(), shapes.size(), scalar, dims);
}

std::string candidate_key(Walk& w, const picojson::object& c, const std::string& path, const OpShape& op,
                          const std::set<std::string>& archs) {
  int64_t index = w.integer(w.field(c, "index", path), path + ".index", 0, CANDIDATES);
  for (const char* key : {"backend", "impl", "impl_fingerprint", "label"}) w.string(w.field(c, key, path), path + "." + key);
  const auto& config = w.obj(w.field(c, "config", path), path + ".config");
  if (static_cast<int64_t>(config.size()) > CONFIG_KEYS)
    w.fail(path + ".config", "has " + std::to_string(config.size()) + " keys, over the cap of " +
                                 std::to_string(CONFIG_KEYS) + " (CONFIG_KEYS)");
  for (const auto& kv : config) {
    if (static_cast<int64_t>(chars(kv.first)) > NAME_CHARS || !identifier(kv.first))
      w.fail(path + ".config", "key " + quoted(kv.first) + " is not an identifier");
    std::string at = path + ".config." + kv.first;
    if (kv.second.is<picojson::array>()) {
      for (const auto& item : w.lst(kv.second, at, CONFIG_KEYS, "CONFIG_KEYS")) w.scalar(item, at);
    } else {
      w.scalar(kv.second, at);
    }
  }
  const auto& kernels = w.lst(w.field(c, "kernels", path), path + ".kernels", KERNELS, "KERNELS");
  for (size_t i = 0; i < kernels.size(); ++i) {
    std::string at = path + ".kernels[" + std::to_string(i) + "]";
    check_kernel(w, w.obj(kernels[i], at), at, op, archs);
  }
  return std::to_string(index) + " " + canonical_json(Json(config));
}

bool reads_stride(const Json& program) {
  for (const auto& t : program.get<picojson::array>())
    if (t.get<picojson::array>()[0].get<std::string>() == "stride") return true;
  return false;
}

// _program.meta_rules: the distinct output rules of the kernels' (checked) programs, symbolic and
// fewer guards first; a rule's guards are the kernel's guard programs that read no stride.
std::vector<Json> meta_rules(const picojson::array& candidates) {
  std::vector<Json> rules;
  std::set<std::string> seen;
  for (const auto& c : candidates)
    for (const auto& kv : c.get("kernels").get<picojson::array>()) {
      const auto& k = kv.get<picojson::object>();
      picojson::object rule;
      rule["dtypes"] = k.at("dtypes");
      rule["ranks"] = k.at("ranks");
      picojson::array guards;
      for (const auto& g : k.at("program").get("guards").get<picojson::array>())
        if (!reads_stride(g)) guards.push_back(g);
      rule["guards"] = Json(guards);
      rule["dynamic"] = k.at("dynamic");
      rule["shapes"] = k.at("program").get("outputs");
      rule["out_dtypes"] = k.at("outputs").get("dtypes");
      auto pinned = k.find("pinned");
      if (pinned != k.end() && !pinned->second.get<picojson::object>().empty()) rule["pinned"] = pinned->second;
      Json value(rule);
      if (seen.insert(canonical_json(value)).second) rules.push_back(value);
    }
  std::stable_sort(rules.begin(), rules.end(), [](const Json& a, const Json& b) {
    auto key = [](const Json& r) {
      return std::make_pair(!r.get("dynamic").get<bool>(), r.get("guards").get<picojson::array>().size());
    };
    return key(a) < key(b);
  });
  return rules;
}

void check_decision(const Walk& w, const picojson::object& row, const std::string& path, const Kinds& kinds,
                    size_t n_candidates) {
  w.string(w.field(row, "arch", path), path + ".arch");
  auto tensor = [&](const std::string& n) { auto it = kinds.find(n); return it != kinds.end() && it->second == "tensor"; };
  auto param = [&](const std::string& n) { return kinds.count(n) > 0; };
  for (const auto& kv : names(w, w.field(row, "tensors", path), path + ".tensors", tensor, "a tensor parameter")) {
    std::string at = path + ".tensors." + kv.first;
    const auto& t = w.obj(kv.second, at);
    w.one_of(w.field(t, "dtype", at), at + ".dtype", set_of(kDtypes));
    const auto& dims = w.lst(w.field(t, "dims", at), at + ".dims", DIMS, "DIMS");
    for (size_t d = 0; d < dims.size(); ++d) {
      std::string ad = at + ".dims[" + std::to_string(d) + "]";
      for (const auto& v : w.lst(dims[d], ad, -1, "", 2)) w.integer(v, ad, INT64_MIN, INT64_MAX);
    }
  }
  for (const auto& kv : names(w, w.field(row, "ints", path), path + ".ints", param, "a parameter"))
    for (const auto& v : w.lst(kv.second, path + ".ints." + kv.first, -1, "", 2))
      w.integer(v, path + ".ints." + kv.first, INT64_MIN, INT64_MAX);
  for (const auto& kv : names(w, w.field(row, "values", path), path + ".values", param, "a parameter"))
    w.scalar(kv.second, path + ".values." + kv.first);
  const auto& ranking = w.lst(w.field(row, "ranking", path), path + ".ranking", CANDIDATES, "CANDIDATES");
  for (size_t i = 0; i < ranking.size(); ++i)
    w.integer(ranking[i], path + ".ranking[" + std::to_string(i) + "]", 0, static_cast<int64_t>(n_candidates) - 1);
  auto source = row.find("source");
  if (source != row.end()) w.string(source->second, path + ".source");
}

std::string check_op(Walk& w, const picojson::object& op, const std::string& path, const std::set<std::string>& archs) {
  const Json& name = w.field(op, "name", path);
  if (!name.is<std::string>()) w.fail(path + ".name", "is " + kind_of(name) + ", not a string");
  const std::string& qualified = name.get<std::string>();
  size_t sep = qualified.find("::");
  if (static_cast<int64_t>(chars(qualified)) > NAME_CHARS)
    w.fail(path + ".name", "is " + std::to_string(chars(qualified)) + " characters, over the cap of " +
                               std::to_string(NAME_CHARS) + " (NAME_CHARS)");
  if (sep == std::string::npos || !identifier(qualified.substr(0, sep)) || !identifier(qualified.substr(sep + 2)))
    w.fail(path + ".name", quoted(qualified) + " is not NAMESPACE::NAME with identifier parts");
  if (set_of(kNamespaces).count(qualified.substr(0, sep)))
    w.fail(path + ".name", quoted(qualified) + ": namespace '" + qualified.substr(0, sep) + "' belongs to PyTorch");
  w.string(w.field(op, "fingerprint", path), path + ".fingerprint");
  for (const char* key : {"module", "doc"}) {
    auto it = op.find(key);
    if (it != op.end() && !it->second.is<picojson::null>()) w.string(it->second, path + "." + key);
  }
  const auto& params = w.lst(w.field(op, "params", path), path + ".params", PARAMS, "PARAMS");
  OpShape shape;
  for (size_t i = 0; i < params.size(); ++i) {
    std::string at = path + ".params[" + std::to_string(i) + "]";
    check_param(w, w.obj(params[i], at), at);
  }
  std::vector<std::string> mutated;
  for (const auto& p : params) {
    const std::string& n = p.get("name").get<std::string>();
    if (shape.kinds.count(n)) w.fail(path + ".params", "name a parameter twice");
    shape.kinds[n] = p.get("kind").get<std::string>();
    shape.params.push_back(n);
    if (p.get("mutated").get<bool>()) mutated.push_back(n);
  }
  static const std::set<std::string> returns_kinds = {"none", "tensor", "tuple"};
  const std::string& returns = w.one_of(w.field(op, "returns", path), path + ".returns", returns_kinds);
  int64_t lo = returns == "none" ? 0 : 1, hi = returns == "none" ? 0 : returns == "tensor" ? 1 : RETURNS;
  shape.n_returns = w.integer(w.field(op, "n_returns", path), path + ".n_returns", lo, hi);
  const auto& mutates = w.lst(w.field(op, "mutates_args", path), path + ".mutates_args", PARAMS, "PARAMS");
  std::vector<std::string> listed;
  for (const auto& m : mutates) {
    if (!m.is<std::string>()) w.fail(path + ".mutates_args", "are not the mutated parameters");
    listed.push_back(m.get<std::string>());
  }
  std::sort(listed.begin(), listed.end());
  std::sort(mutated.begin(), mutated.end());
  if (listed != mutated || std::adjacent_find(listed.begin(), listed.end()) != listed.end())
    w.fail(path + ".mutates_args", "are not the mutated parameters");
  check_schema(w, w.field(op, "schema", path), params, returns, shape.n_returns, path + ".schema");
  const auto& candidates = w.lst(w.field(op, "candidates", path), path + ".candidates", CANDIDATES, "CANDIDATES");
  std::set<std::string> seen;
  for (size_t i = 0; i < candidates.size(); ++i) {
    std::string at = path + ".candidates[" + std::to_string(i) + "]";
    if (!seen.insert(candidate_key(w, w.obj(candidates[i], at), at, shape, archs)).second)
      w.fail(at, "repeats the index and config of an earlier candidate");
  }
  const auto& meta = w.lst(w.field(op, "meta", path), path + ".meta");
  std::vector<Json> want = meta_rules(candidates);
  bool same = meta.size() == want.size();
  for (size_t i = 0; same && i < meta.size(); ++i) same = canonical_json(meta[i]) == canonical_json(want[i]);
  if (!same) w.fail(path + ".meta", "is not the output rules its kernels give (rebuild the bundle)");
  const auto& rows = w.lst(w.field(op, "decisions", path), path + ".decisions", DECISIONS, "DECISIONS");
  for (size_t i = 0; i < rows.size(); ++i) {
    std::string at = path + ".decisions[" + std::to_string(i) + "]";
    check_decision(w, w.obj(rows[i], at), at, shape.kinds, candidates.size());
  }
  return qualified;
}

}  // namespace

std::string readable_versions() {
  std::string out;
#define KG_VERSION(number, has_programs) \
  if (has_programs) out += (out.empty() ? "" : ", ") + std::to_string(number);
#include "bundle_spec.h"
  return out;
}

bool readable_version(int64_t version) {
#define KG_VERSION(number, has_programs) \
  if (version == number) return has_programs != 0;
#include "bundle_spec.h"
  return false;
}

const std::vector<std::string>& dtypes() {
  static const std::vector<std::string> names = {
#define KG_DTYPE(name, scalar_type) name,
#include "bundle_spec.h"
  };
  return names;
}

void check_manifest(const Json& manifest, const std::string& where) {
  Walk w(where, manifest.get("version").get<int64_t>());
  const auto& m = w.obj(manifest, "manifest");
  const auto& archs = w.lst(w.field(m, "archs", "archs"), "archs", ARCHS, "ARCHS");
  if (archs.empty()) w.fail("archs", "is empty");
  std::set<std::string> arch_set;
  for (size_t i = 0; i < archs.size(); ++i) {
    if (!archs[i].is<std::string>() || !arch_name(archs[i].get<std::string>()))
      w.fail("archs[" + std::to_string(i) + "]", "is not an arch name sm_NN");
    arch_set.insert(archs[i].get<std::string>());
  }
  if (arch_set.size() != archs.size()) w.fail("archs", "names an arch twice");
  w.obj(w.field(m, "toolchain", "toolchain"), "toolchain");
  const auto& ops = w.lst(w.field(m, "ops", "ops"), "ops", OPS, "OPS");
  std::set<std::string> names_seen;
  for (size_t i = 0; i < ops.size(); ++i) {
    std::string at = "ops[" + std::to_string(i) + "]";
    std::string name = check_op(w, w.obj(ops[i], at), at, arch_set);
    if (!names_seen.insert(name).second) w.fail(at + ".name", quoted(name) + " names two ops");
  }
}

}  // namespace spec
}  // namespace kgrt
