#include "bundle.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "crypto.h"
#include "native.h"
#include "spec.h"

namespace kgrt {
namespace {

const char* kFormat = "kernelgraft-bundle";
const char* kSignature = "signature.json";

// The files one load reads (kernelgraft/aot/manifest.py's Reads): each at most once, stat'ed and
// refused over its cap before a byte is read, all reads charged to spec::TOTAL_BYTES. A signed
// bundle's files are the bytes the signature verified.
class Reader {
 public:
  struct File {
    std::shared_ptr<const std::string> data;
    std::string sha256;  // computed once per file
  };

  explicit Reader(std::string root) : root_(std::move(root)) {}

  const File& file(const std::string& name, int64_t cap, int64_t size = -1) {
    auto found = files_.find(name);
    if (found == files_.end()) {
      auto data = std::make_shared<const std::string>(read(name, cap, size));
      found = files_.emplace(name, File{data, ""}).first;
    } else if (size >= 0 && static_cast<int64_t>(found->second.data->size()) != size) {
      throw BundleError("bundle " + root_ + ": " + name + " is " + std::to_string(found->second.data->size()) +
                        " bytes, the manifest says " + std::to_string(size));
    }
    return found->second;
  }

  const std::string& sha256(const std::string& name) {
    File& f = files_.at(name);
    if (f.sha256.empty()) f.sha256 = sha256_hex(*f.data);
    return f.sha256;
  }

  void charge(const std::string& name, int64_t size) {
    total_ += size;
    if (total_ > spec::TOTAL_BYTES)
      throw BundleError("bundle " + root_ + ": reading " + name + " passes the cap of " +
                        std::to_string(spec::TOTAL_BYTES) + " bytes read from one bundle (TOTAL_BYTES)");
  }

  const std::string& root() const { return root_; }

 private:
  // A regular file of at most `cap` bytes (of exactly `size` when >= 0), opened without following
  // a final symlink and without blocking, so a FIFO or a link to /dev/zero is refused at once.
  std::string read(const std::string& name, int64_t cap, int64_t size) {
    std::string path = root_ + "/" + name;
    int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      std::string why = errno == ELOOP ? "it is a symlink" : std::strerror(errno);
      throw BundleError("bundle " + root_ + ": cannot read " + name + " (" + why +
                        "); a bundle holds regular files only");
    }
    struct stat st;
    std::string data;
    try {
      if (::fstat(fd, &st) != 0) throw BundleError("bundle " + root_ + ": cannot stat " + name);
      if (!S_ISREG(st.st_mode))
        throw BundleError("bundle " + root_ + ": " + name + " is not a regular file; a bundle holds regular files only");
      if (st.st_size > cap)
        throw BundleError("bundle " + root_ + ": " + name + " is " + std::to_string(st.st_size) + " bytes, over the " +
                          std::to_string(cap) + "-byte cap");
      if (size >= 0 && st.st_size != size)
        throw BundleError("bundle " + root_ + ": " + name + " is " + std::to_string(st.st_size) +
                          " bytes, the manifest says " + std::to_string(size));
      charge(name, st.st_size);
      data.resize(static_cast<size_t>(st.st_size) + 1);  // one byte more: a file that grew is seen
      size_t got = 0;
      while (got < data.size()) {
        ssize_t n = ::read(fd, &data[got], data.size() - got);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) throw BundleError("bundle " + root_ + ": cannot read " + name + ": " + std::strerror(errno));
        if (n == 0) break;
        got += static_cast<size_t>(n);
      }
      if (got != static_cast<size_t>(st.st_size)) throw BundleError("bundle " + root_ + ": " + name + " changed while being read");
      data.resize(got);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
    return data;
  }

  std::string root_;
  int64_t total_ = 0;
  std::map<std::string, File> files_;
};

std::vector<std::string> list_bin(const std::string& root) {
  DIR* dir = ::opendir((root + "/bin").c_str());
  if (dir == nullptr) throw BundleError("bundle " + root + ": cannot list bin/: " + std::strerror(errno));
  std::vector<std::string> names;
  while (dirent* e = ::readdir(dir)) {
    std::string n = e->d_name;
    if (n == "." || n == "..") continue;
    names.push_back("bin/" + n);
    if (static_cast<int64_t>(names.size()) > spec::FILES) {
      ::closedir(dir);
      throw BundleError("bundle " + root + ": bin/ holds more than " + std::to_string(spec::FILES) +
                        " files, over the cap (FILES)");
    }
  }
  ::closedir(dir);
  std::sort(names.begin(), names.end());  // Python sorts os.listdir by code point: UTF-8 byte order
  return names;
}

std::string mac(const std::string& key, const std::string& name, const std::string& data) {
  return hmac_sha256_hex(key, name + std::string(1, '\0') + data);
}

bool signed_name(const std::string& n) {
  static const std::string tail = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-";
  return n == "manifest.json" ||
         (n.size() > 4 && n.rfind("bin/", 0) == 0 && n[4] != '.' && n.find_first_not_of(tail, 4) == std::string::npos);
}

bool hex64(const std::string& s) { return s.size() == 64 && s.find_first_not_of("0123456789abcdef") == std::string::npos; }

// kernelgraft/aot/sign.py's verify_bundle: returns the verified manifest bytes (and leaves every
// verified file's bytes in `reader`).
std::string verify_signature(Reader& reader, const std::string& key) {
  const std::string& root = reader.root();
  struct stat st;
  if (::lstat((root + "/" + kSignature).c_str(), &st) != 0)
    throw BundleError("bundle " + root + " is not signed (no signature.json) and a key was given; sign it with "
                      "`kernelgraft aot ... --sign KEYFILE` or load it without a key");
  std::string where = "bundle " + root + ": signature.json";
  Json body = parse_json(*reader.file(kSignature, spec::SIGNATURE_BYTES).data, where);
  if (!body.is<picojson::object>() || !body.contains("files") || !body.get("files").is<picojson::object>() ||
      !body.contains("format") || body.get("format").to_str() != "kernelgraft-bundle-signature" ||
      !body.contains("algorithm") || body.get("algorithm").to_str() != "hmac-sha256" ||
      static_cast<int64_t>(body.get("files").get<picojson::object>().size()) > spec::FILES + 1)
    throw BundleError(where + " is not a hmac-sha256 bundle signature");
  const auto& files = body.get("files").get<picojson::object>();
  for (const auto& kv : files)
    if (!kv.second.is<std::string>() || !hex64(kv.second.get<std::string>()) || !signed_name(kv.first))
      throw BundleError(where + " is not a hmac-sha256 bundle signature");
  std::string seal = mac(key, kSignature, canonical_json(body.get("files")));
  std::string recorded = body.contains("mac") && body.get("mac").is<std::string>() ? body.get("mac").get<std::string>() : "";
  if (!equal_constant_time(recorded, seal))
    throw BundleError(where + " does not verify with this key: it was signed with another key or modified");
  std::vector<std::string> present = list_bin(root);
  present.insert(present.begin(), "manifest.json");
  std::set<std::string> have(present.begin(), present.end());
  for (const auto& n : present)
    if (!files.count(n)) throw BundleError("bundle " + root + " was modified after signing: added " + n);
  for (const auto& kv : files)
    if (!have.count(kv.first)) throw BundleError("bundle " + root + " was modified after signing: removed " + kv.first);
  std::string manifest;
  for (const auto& n : present) {
    const std::string& data = *reader.file(n, n == "manifest.json" ? spec::MANIFEST_BYTES : spec::FILE_BYTES).data;
    if (!equal_constant_time(files.at(n).get<std::string>(), mac(key, n, data)))
      throw BundleError("bundle " + root + " was modified after signing: " + n + " differs from the signed file");
    if (n == "manifest.json") manifest = data;
  }
  return manifest;
}

// A binary named in the manifest (checked by the spec: a file of bin/ with a sha256 and a size),
// its size and sha256 checked against the file.
std::shared_ptr<const std::string> read_binary(Reader& reader, const Json& image) {
  const std::string& name = image.get("file").get<std::string>();
  int64_t size = image.get("bytes").get<int64_t>();
  std::shared_ptr<const std::string> data = reader.file(name, spec::FILE_BYTES, size).data;
  const std::string& got = reader.sha256(name);
  const std::string& want = image.get("sha256").get<std::string>();
  if (got != want)
    throw BundleError("bundle " + reader.root() + ": checksum mismatch for " + name + ": manifest says " +
                      want.substr(0, 16) + "..., file has " + got.substr(0, 16) +
                      "...; the binary was modified or corrupted; rebuild the bundle");
  return data;
}

void check_cubin(const std::string& where, const std::string& image, const std::string& kernel) {
  if (image.size() < 64 || image.compare(0, 5, "\x7f" "ELF\x02") != 0 ||
      (static_cast<unsigned char>(image[18]) | (static_cast<unsigned char>(image[19]) << 8)) != 190)
    throw BundleError(where + ": the cubin is not a 64-bit CUDA ELF image");
  if (image.find(kernel + std::string(1, '\0')) == std::string::npos)
    throw BundleError(where + ": the cubin does not define kernel " + kernel);
}

bool known_kind(const std::string& k) {
  static const std::set<std::string> kinds = {"ptr", "i8", "i16", "i32", "i64", "u8", "u16",
                                              "u32", "u64", "f16", "f32", "f64"};
  return kinds.count(k) > 0;
}

struct Names {
  std::map<std::string, int> inputs;
  int n_returns;
  // input index >= 0, output -(i + 1) for "out<i>", BundleError otherwise
  int source(const std::string& name, const std::string& where) const {
    auto it = inputs.find(name);
    if (it != inputs.end()) return it->second;
    if (name.rfind("out", 0) == 0 && name.size() > 3 && name.size() < 6 &&
        name.find_first_not_of("0123456789", 3) == std::string::npos) {
      int i = std::stoi(name.substr(3));
      if (i < n_returns) return -(i + 1);
    }
    throw BundleError(where + ": '" + name + "' is not an input or output of the op");
  }
};

template <class T>
void typed_pairs(const Json& obj, const Names& names, const std::string& where,
                 std::vector<std::pair<int, T>>* out, T (*get)(const Json&, const std::string&)) {
  for (const auto& kv : as_object(obj, where)) {
    int i = names.source(kv.first, where);
    if (i < 0) throw BundleError(where + ": '" + kv.first + "' is not an input");
    out->emplace_back(i, get(kv.second, where + " " + kv.first));
  }
}

std::string get_string(const Json& v, const std::string& w) { return as_string(v, w); }
int64_t get_int(const Json& v, const std::string& w) { return as_int(v, w); }

std::vector<std::vector<Program>> shapes(const Json& list, size_t n, const std::string& where) {
  std::vector<std::vector<Program>> out;
  for (const auto& shape : as_array(list, where)) {
    std::vector<Program> dims;
    for (const auto& d : as_array(shape, where)) dims.emplace_back(d, n, where + " output shape");
    out.push_back(std::move(dims));
  }
  return out;
}

std::vector<Program> programs(const Json& list, size_t n, const std::string& where) {
  std::vector<Program> out;
  for (const auto& p : as_array(list, where)) out.emplace_back(p, n, where);
  return out;
}

std::vector<std::string> strings(const Json& list, const std::string& where) {
  std::vector<std::string> out;
  for (const auto& s : as_array(list, where)) out.push_back(as_string(s, where));
  return out;
}

// What was checked of the files once (kernelgraft/aot/load.py's _check_binaries does the same):
// a cubin defines a kernel, per (file, kernel name), each such scan charged to the read budget; a
// library, per file.
using Checked = std::set<std::string>;

Kernel read_kernel(Reader& reader, const Json& k, const Names& names, size_t n, int n_returns,
                   const std::string& label, Checked* checked) {
  const std::string& root = reader.root();
  Kernel out;
  out.name = as_string(field(k, "kernel", label), label + " kernel");
  out.where = "bundle " + root + ": " + label + " kernel " + out.name;
  const std::string& w = out.where;
  const Json& prog = field(k, "program", w);
  typed_pairs<std::string>(field(k, "dtypes", w), names, w + " dtypes", &out.dtypes, get_string);
  typed_pairs<int64_t>(field(k, "ranks", w), names, w + " ranks", &out.ranks, get_int);
  if (k.contains("pinned")) typed_pairs<std::string>(k.get("pinned"), names, w + " pinned", &out.pinned, get_string);
  out.guards = programs(field(prog, "guards", w), n, w + " guard");
  const auto& grid = as_array(field(prog, "grid", w), w + " grid");
  const auto& block = as_array(field(k, "block", w), w + " block");
  if (grid.size() != 3 || block.size() != 3) throw BundleError(w + ": grid and block need 3 dimensions");
  int64_t threads = 1;
  for (int d = 0; d < 3; ++d) {
    out.grid[d] = Program(grid[d], n, w + " grid");
    out.block[d] = as_int(block[d], w + " block");
    static const int64_t limit[3] = {1024, 1024, 64};
    if (out.block[d] < 1 || out.block[d] > limit[d]) throw BundleError(w + ": block is outside the device limits");
    threads *= out.block[d];
  }
  if (threads > 1024) throw BundleError(w + ": block has more than 1024 threads");
  out.shared_mem = Program(field(prog, "shared_mem", w), n, w + " shared_mem");
  const auto& params = as_array(field(k, "params", w), w + " params");
  const auto& exprs = as_array(field(prog, "params", w), w + " program params");
  if (params.size() != exprs.size()) throw BundleError(w + ": params and their programs differ in number");
  for (size_t i = 0; i < params.size(); ++i) {
    std::string pw = w + " param " + std::to_string(i);
    KernelParam p;
    p.kind = as_string(field(params[i], "kind", pw), pw + " kind");
    if (!known_kind(p.kind)) throw BundleError(pw + ": kind '" + p.kind + "' is not a kernel parameter kind");
    const auto& po = as_object(params[i], pw);
    if (p.kind == "ptr") {
      if (po.count("source")) {
        int s = names.source(as_string(po.at("source"), pw), pw);
        (s >= 0 ? p.input : p.output) = s >= 0 ? s : -s - 1;
      } else if (po.count("null") && po.at("null").is<bool>() && po.at("null").get<bool>()) {
        p.null = true;
      } else {
        throw BundleError(pw + ": a pointer with neither a source nor null");
      }
    } else {
      if (exprs[i].is<picojson::null>()) throw BundleError(pw + ": a scalar parameter without a program");
      p.expr = Program(exprs[i], n, pw);
    }
    out.params.push_back(std::move(p));
  }
  if (k.contains("contiguous")) {  // the inputs traced contiguous (the others' strides are in the programs)
    for (const auto& a : as_array(k.get("contiguous"), w + " contiguous")) {
      int s = names.source(as_string(a, w + " contiguous"), w + " contiguous");
      bool typed = false;
      for (const auto& d : out.dtypes) typed |= d.first == s;
      if (!typed) throw BundleError(w + ": contiguous names '" + a.get<std::string>() + "', not a tensor input of the kernel");
      out.contiguous.push_back(s);
    }
  } else {  // a manifest from before strided kernels: every tensor input was traced contiguous
    for (const auto& d : out.dtypes) out.contiguous.push_back(d.first);
  }
  for (const auto& a : as_array(field(k, "aligned", w), w + " aligned")) {
    int s = names.source(as_string(a, w + " aligned"), w + " aligned");
    if (s >= 0) out.aligned.push_back(s);  // outputs are fresh allocations: always aligned
  }
  out.out_shapes = shapes(field(prog, "outputs", w), n, w);
  out.out_dtypes = strings(field(field(k, "outputs", w), "dtypes", w), w + " output dtypes");
  if (static_cast<int>(out.out_shapes.size()) != n_returns || static_cast<int>(out.out_dtypes.size()) != n_returns)
    throw BundleError(w + ": " + std::to_string(out.out_shapes.size()) + " output shapes for an op of " +
                      std::to_string(n_returns) + " returns");
  const Json& images = field(k, "images", w);
  for (const auto& kv : as_object(images, w + " images")) {  // every image is verified, not only the cubin
    std::shared_ptr<const std::string> data = read_binary(reader, kv.second);
    const std::string& file = kv.second.get("file").get<std::string>();
    if (kv.first == "so" || kv.first == "runtime") {
      if (checked->insert(kv.first + " " + file).second) check_library(w, *data, kv.first == "so");
      (kv.first == "so" ? out.library : out.runtime) = data;
    } else if (kv.first == "cubin") {
      if (checked->insert("cubin " + file + " " + out.name).second) {
        reader.charge(file, static_cast<int64_t>(data->size()));  // the scan for the kernel's name
        check_cubin(w, *data, out.name);
      }
      out.cubin = data;
    }
  }
  out.native = out.library != nullptr;
  if (out.native) {
    if (out.runtime == nullptr) throw BundleError(w + ": no runtime image (the CUDA dialect runtime the library needs)");
    return out;
  }
  if (out.cubin == nullptr) throw BundleError(w + ": no cubin image");
  return out;
}

DecisionRow read_row(const Json& row, const Names& names, size_t n_candidates, const std::string& w) {
  DecisionRow out;
  for (const auto& kv : as_object(field(row, "tensors", w), w + " tensors")) {
    DecisionRow::TensorRange t;
    t.input = names.source(kv.first, w);
    if (t.input < 0) throw BundleError(w + ": '" + kv.first + "' is not an input");
    t.dtype = as_string(field(kv.second, "dtype", w), w + " dtype");
    for (const auto& d : as_array(field(kv.second, "dims", w), w + " dims")) {
      const auto& r = as_array(d, w + " dims");
      if (r.size() != 2) throw BundleError(w + ": a dimension range is not [lo, hi]");
      t.dims.emplace_back(as_int(r[0], w), as_int(r[1], w));
    }
    out.tensors.push_back(std::move(t));
  }
  for (const auto& kv : as_object(field(row, "ints", w), w + " ints")) {
    const auto& r = as_array(kv.second, w + " ints");
    if (r.size() != 2) throw BundleError(w + ": an int range is not [lo, hi]");
    out.ints.push_back({names.source(kv.first, w), {as_int(r[0], w), as_int(r[1], w)}});
  }
  for (const auto& kv : as_object(field(row, "values", w), w + " values"))
    out.values.emplace_back(names.source(kv.first, w), kv.second);
  for (const auto& r : as_array(field(row, "ranking", w), w + " ranking")) {
    int64_t c = as_int(r, w + " ranking");
    if (c < 0 || static_cast<size_t>(c) >= n_candidates) throw BundleError(w + ": ranking names no candidate");
    out.ranking.push_back(static_cast<int>(c));
  }
  if (row.contains("source") && row.get("source").is<std::string>()) out.source = row.get("source").get<std::string>();
  return out;
}

bool is_native(const Json& k) {
  return k.contains("images") && k.get("images").is<picojson::object>() && k.get("images").contains("so");
}

OpEntry read_op(Reader& reader, const Json& e, const std::string& arch, bool native,
                std::vector<std::string>* left_out, Checked* checked) {
  const std::string& root = reader.root();
  OpEntry op;
  std::string w = "bundle " + root + ": op";
  op.qualified = as_string(field(e, "name", w), w + " name");
  w = "bundle " + root + ": op " + op.qualified;
  size_t sep = op.qualified.find("::");
  if (sep == std::string::npos || sep == 0 || sep + 2 >= op.qualified.size())
    throw BundleError(w + ": the name is not NAMESPACE::NAME");
  op.ns = op.qualified.substr(0, sep);
  op.name = op.qualified.substr(sep + 2);
  op.schema = as_string(field(e, "schema", w), w + " schema");
  op.fingerprint = as_string(field(e, "fingerprint", w), w + " fingerprint");
  op.n_returns = static_cast<int>(as_int(field(e, "n_returns", w), w + " n_returns"));
  if (op.n_returns < 0 || op.n_returns > 64) throw BundleError(w + ": n_returns out of range");
  Names names{{}, op.n_returns};
  for (const auto& p : as_array(field(e, "params", w), w + " params")) {
    OpParam param{as_string(field(p, "name", w), w + " param name"), as_string(field(p, "kind", w), w + " param kind")};
    if (!names.inputs.emplace(param.name, static_cast<int>(op.params.size())).second)
      throw BundleError(w + ": parameter '" + param.name + "' repeats");
    op.params.push_back(param);
  }
  size_t n = op.params.size();
  for (const auto& c : as_array(field(e, "candidates", w), w + " candidates")) {
    Candidate cand;
    cand.label = as_string(field(c, "label", w), w + " candidate label");
    for (const auto& k : as_array(field(c, "kernels", w), w + " kernels")) {
      if (as_string(field(k, "arch", w), w + " kernel arch") != arch) continue;
      if (!native && is_native(k)) {
        std::string label = op.qualified + " " + cand.label;
        if (left_out->empty() || left_out->back() != label) left_out->push_back(label);
        continue;
      }
      cand.kernels.push_back(read_kernel(reader, k, names, n, op.n_returns, op.qualified + " " + cand.label, checked));
    }
    op.candidates.push_back(std::move(cand));  // kept even when empty: decision rows index them
  }
  for (const auto& r : as_array(field(e, "meta", w), w + " meta")) {
    MetaRule rule;
    typed_pairs<std::string>(field(r, "dtypes", w), names, w + " meta dtypes", &rule.dtypes, get_string);
    typed_pairs<int64_t>(field(r, "ranks", w), names, w + " meta ranks", &rule.ranks, get_int);
    if (r.contains("pinned"))
      typed_pairs<std::string>(r.get("pinned"), names, w + " meta pinned", &rule.pinned, get_string);
    rule.guards = programs(field(r, "guards", w), n, w + " meta guard");
    rule.shapes = shapes(field(r, "shapes", w), n, w + " meta");
    rule.out_dtypes = strings(field(r, "out_dtypes", w), w + " meta dtypes");
    if (static_cast<int>(rule.shapes.size()) != op.n_returns || static_cast<int>(rule.out_dtypes.size()) != op.n_returns)
      throw BundleError(w + ": a meta rule's outputs differ from the op's returns");
    op.meta.push_back(std::move(rule));
  }
  for (const auto& r : as_array(field(e, "decisions", w), w + " decisions")) {
    if (!r.contains("arch") || r.get("arch").to_str() != arch) continue;
    op.decisions.push_back(read_row(r, names, op.candidates.size(), w + " decision"));
  }
  return op;
}

}  // namespace

std::string read_key_file(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw BundleError("cannot read the bundle key file " + path + ": " + std::strerror(errno));
  std::string data(65536, '\0');
  ssize_t n = ::read(fd, &data[0], data.size());
  ::close(fd);
  if (n < 0) throw BundleError("cannot read the bundle key file " + path + ": " + std::strerror(errno));
  data.resize(static_cast<size_t>(n));
  const char* space = " \t\n\r\x0b\x0c";
  size_t a = data.find_first_not_of(space), b = data.find_last_not_of(space);
  data = a == std::string::npos ? "" : data.substr(a, b - a + 1);
  if (data.size() < 16)
    throw BundleError("key file " + path + " has " + std::to_string(data.size()) +
                      " bytes; a bundle key needs at least 16");
  return data;
}

std::shared_ptr<Bundle> read_bundle(const std::string& path, const std::string& arch, const std::string& key,
                                    bool allow_native) {
  auto bundle = std::make_shared<Bundle>();
  bundle->path = path;
  bundle->arch = arch;
  bundle->signed_ = !key.empty();
  Reader reader(path);
  std::string text = key.empty() ? *reader.file("manifest.json", spec::MANIFEST_BYTES).data : verify_signature(reader, key);
  std::string w = "bundle " + path + ": manifest.json";
  Json manifest = parse_json(text, w);
  if (!manifest.is<picojson::object>() || !manifest.contains("format") || manifest.get("format").to_str() != kFormat)
    throw BundleError(w + " is not a kernelgraft bundle manifest");
  int64_t version = as_int(field(manifest, "version", w), w + " version");
  if (!spec::readable_version(version))
    throw BundleError("bundle " + path + ": manifest version " + std::to_string(version) +
                      "; the C++ runtime reads version " + spec::readable_versions() +
                      " (2 and 3 held one program for all of a kernel's guards, which it no longer reads): "
                      "rebuild the bundle with `kernelgraft aot`");
  bundle->checksum = as_string(field(manifest, "checksum", w), w + " checksum");
  Json body = manifest;
  body.get<picojson::object>().erase("checksum");
  std::string want = sha256_hex(canonical_json(body));
  if (want != bundle->checksum)
    throw BundleError(w + " checksum mismatch (recorded " + bundle->checksum.substr(0, 16) + "..., content " +
                      want.substr(0, 16) + "...): the manifest was modified or corrupted after it was built; "
                      "rebuild the bundle");
  spec::check_manifest(manifest, w);  // before anything else reads it
  bool has_arch = false;
  std::string archs;
  for (const auto& a : as_array(field(manifest, "archs", w), w + " archs")) {
    has_arch |= as_string(a, w + " archs") == arch;
    archs += (archs.empty() ? "" : ", ") + a.get<std::string>();
  }
  if (!has_arch)
    throw BundleError("bundle " + path + " was built for " + archs + ", not for " + arch +
                      "; rebuild it with `kernelgraft aot TARGET --arch " + arch + " -o DIR`");
  Checked checked;
  for (const auto& e : as_array(field(manifest, "ops", w), w + " ops"))
    bundle->ops.push_back(read_op(reader, e, arch, allow_native || !key.empty(), &bundle->left_out, &checked));
  return bundle;
}

}  // namespace kgrt
