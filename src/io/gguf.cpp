#include "io/gguf.hpp"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "hanpu/tensor.hpp"
#include "io/file_io.hpp"
#include "io/json_io.hpp"

namespace hanpu {

static_assert(std::endian::native == std::endian::little, "hanpu's GGUF reader assumes a little-endian host");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
// An array nested deeper than this is not metadata any writer produces; refused before recursing
// so that a hostile file cannot exhaust the stack.
constexpr int kMaxArrayDepth = 4;
// Keys and tensor names longer than this are not names (ggml itself caps tensor names at 64).
constexpr uint64_t kMaxNameBytes = 1u << 16;
constexpr int kMaxDims = 4;

std::string quote_name(const std::string& s) { return "'" + printable(s) + "'"; }

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("GGUF file " + quote_name(path) + ": " + what);
}

// Bounds-checked little-endian reads from the mapped bytes. Every read says what it reads, so a
// truncated file is reported as "truncated while reading <what> at byte N".
class Cursor {
 public:
  Cursor(const std::string& path, const std::byte* data, uint64_t size) : path_(path), data_(data), size_(size) {}
  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  void need(uint64_t n, const std::string& what) const {
    if (n > remaining())
      fail(path_, "truncated: " + what + " needs " + std::to_string(n) + " bytes at byte " + std::to_string(pos_) +
                      ", the file has " + std::to_string(remaining()) + " left");
  }
  template <class T>
  T read(const std::string& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string read_string(const std::string& what, uint64_t max_bytes) {
    const uint64_t n = read<uint64_t>(what + " length");
    if (n > max_bytes)
      fail(path_, what + " length " + std::to_string(n) + " at byte " + std::to_string(pos_ - 8) +
                      " is above the limit of " + std::to_string(max_bytes));
    need(n, what + " (" + std::to_string(n) + " bytes)");
    std::string s(reinterpret_cast<const char*>(data_ + pos_), static_cast<size_t>(n));
    pos_ += n;
    return s;
  }

 private:
  const std::string& path_;
  const std::byte* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

// The smallest encoding of one value of a type: bounds an element count by the bytes left.
uint64_t min_encoded_bytes(GgufType t) {
  switch (t) {
    case GgufType::U8: case GgufType::I8: case GgufType::BOOL: return 1;
    case GgufType::U16: case GgufType::I16: return 2;
    case GgufType::U32: case GgufType::I32: case GgufType::F32: return 4;
    case GgufType::U64: case GgufType::I64: case GgufType::F64: case GgufType::STRING: return 8;
    case GgufType::ARRAY: return 12;
  }
  return 1;
}

bool known_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::F64); }

GgufValue read_value(Cursor& c, const std::string& path, const std::string& key, GgufType type, int depth) {
  GgufValue v;
  v.type = type;
  const std::string what = "value of key " + quote_name(key);
  switch (type) {
    case GgufType::U8: v.value = uint64_t{c.read<uint8_t>(what)}; break;
    case GgufType::U16: v.value = uint64_t{c.read<uint16_t>(what)}; break;
    case GgufType::U32: v.value = uint64_t{c.read<uint32_t>(what)}; break;
    case GgufType::U64: v.value = c.read<uint64_t>(what); break;
    case GgufType::I8: v.value = int64_t{c.read<int8_t>(what)}; break;
    case GgufType::I16: v.value = int64_t{c.read<int16_t>(what)}; break;
    case GgufType::I32: v.value = int64_t{c.read<int32_t>(what)}; break;
    case GgufType::I64: v.value = c.read<int64_t>(what); break;
    case GgufType::F32: v.value = double{c.read<float>(what)}; break;
    case GgufType::F64: v.value = c.read<double>(what); break;
    case GgufType::BOOL: {
      const uint8_t b = c.read<uint8_t>(what);
      if (b > 1) fail(path, "key " + quote_name(key) + ": bool value is " + std::to_string(b) + ", expected 0 or 1");
      v.value = b == 1;
      break;
    }
    case GgufType::STRING: v.value = c.read_string(what, std::numeric_limits<uint64_t>::max()); break;
    case GgufType::ARRAY: {
      if (depth >= kMaxArrayDepth)
        fail(path, "key " + quote_name(key) + ": arrays nested deeper than " + std::to_string(kMaxArrayDepth) + " levels");
      const uint32_t et = c.read<uint32_t>(what + " (array element type)");
      if (!known_type(et))
        fail(path, "key " + quote_name(key) + ": array element type " + std::to_string(et) +
                       " is not a GGUF value type (expected 0..12)");
      v.elem_type = static_cast<GgufType>(et);
      const uint64_t n = c.read<uint64_t>(what + " (array length)");
      const uint64_t max_n = c.remaining() / min_encoded_bytes(v.elem_type);
      if (n > max_n)
        fail(path, "key " + quote_name(key) + ": array of " + std::to_string(n) + " " + gguf_type_name(v.elem_type) +
                       " cannot fit in the " + std::to_string(c.remaining()) + " bytes left in the file");
      std::vector<GgufValue> items;
      items.reserve(static_cast<size_t>(n));
      for (uint64_t i = 0; i < n; ++i) items.push_back(read_value(c, path, key, v.elem_type, depth + 1));
      v.value = std::move(items);
      break;
    }
  }
  return v;
}

std::string dims_str(const GgufTensorInfo& t) {
  std::string s = "[";
  for (int d = 0; d < t.n_dims; ++d) s += (d ? ", " : "") + std::to_string(t.dims[d]);
  return s + "]";
}

}  // namespace

const char* gguf_type_name(GgufType t) {
  switch (t) {
    case GgufType::U8: return "u8";
    case GgufType::I8: return "i8";
    case GgufType::U16: return "u16";
    case GgufType::I16: return "i16";
    case GgufType::U32: return "u32";
    case GgufType::I32: return "i32";
    case GgufType::F32: return "f32";
    case GgufType::BOOL: return "bool";
    case GgufType::STRING: return "string";
    case GgufType::ARRAY: return "array";
    case GgufType::U64: return "u64";
    case GgufType::I64: return "i64";
    case GgufType::F64: return "f64";
  }
  return "?";
}

bool GgufValue::is_integer() const {
  return std::holds_alternative<uint64_t>(value) || std::holds_alternative<int64_t>(value);
}

std::string GgufValue::describe() const {
  const std::string t = gguf_type_name(type);
  if (const auto* u = std::get_if<uint64_t>(&value)) return t + " " + std::to_string(*u);
  if (const auto* i = std::get_if<int64_t>(&value)) return t + " " + std::to_string(*i);
  if (const auto* d = std::get_if<double>(&value)) return t + " " + std::to_string(*d);
  if (const auto* b = std::get_if<bool>(&value)) return t + (*b ? " true" : " false");
  if (const auto* s = std::get_if<std::string>(&value)) return t + " " + quote_name(s->size() > 64 ? s->substr(0, 64) + "..." : *s);
  const auto& a = std::get<std::vector<GgufValue>>(value);
  return "array of " + std::to_string(a.size()) + " " + gguf_type_name(elem_type);
}

GgufFile parse_gguf(const std::string& path, const std::byte* data, uint64_t size) {
  GgufFile f;
  f.path_ = path;
  Cursor c(path, data, size);
  if (size < 4) fail(path, "file is " + std::to_string(size) + " bytes, shorter than the 4-byte magic");
  const uint32_t magic = c.read<uint32_t>("magic");
  if (magic != kMagic) {
    char m[5] = {};
    std::memcpy(m, &magic, 4);
    fail(path, "magic is " + quote_name(std::string(m, 4)) + ", expected 'GGUF'; not a GGUF file");
  }
  const uint32_t version = c.read<uint32_t>("version");
  if (version != 2 && version != 3) {
    if (version != 0 && (version & 0xFFFF) == 0)
      fail(path, "version field reads " + std::to_string(version) + ": a big-endian GGUF file, expected little-endian");
    fail(path, "version " + std::to_string(version) + " is not supported (expected 2 or 3" +
                   (version == 1 ? "; version 1 files predate 64-bit counts" : "") + ")");
  }
  f.version_ = version;
  const uint64_t n_tensors = c.read<uint64_t>("tensor count");
  const uint64_t n_kv = c.read<uint64_t>("metadata count");
  // Each metadata entry takes at least 8 (key length) + 4 (type) + 1 bytes, each tensor info at
  // least 8 + 4 + 4 + 8: counts beyond what the file can hold are refused before any allocation.
  if (n_kv > c.remaining() / 13)
    fail(path, "metadata count " + std::to_string(n_kv) + " cannot fit in a file of " + std::to_string(size) + " bytes");
  if (n_tensors > c.remaining() / 24)
    fail(path, "tensor count " + std::to_string(n_tensors) + " cannot fit in a file of " + std::to_string(size) + " bytes");

  // --- metadata ---------------------------------------------------------------------------------
  f.metadata_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.read_string("metadata key #" + std::to_string(i), kMaxNameBytes);
    if (key.empty()) fail(path, "metadata key #" + std::to_string(i) + " is empty");
    if (f.key_index_.count(key)) fail(path, "key " + quote_name(key) + " appears twice");
    const uint32_t t = c.read<uint32_t>("type of key " + quote_name(key));
    if (!known_type(t))
      fail(path, "key " + quote_name(key) + ": value type " + std::to_string(t) + " is not a GGUF value type (expected 0..12)");
    GgufValue v = read_value(c, path, key, static_cast<GgufType>(t), 0);
    f.key_index_.emplace(key, f.metadata_.size());
    f.metadata_.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufValue* a = f.find("general.alignment")) {
    const auto* u = std::get_if<uint64_t>(&a->value);
    if (a->type != GgufType::U32 || !u)
      fail(path, "key 'general.alignment' is " + a->describe() + ", expected a u32");
    if (*u == 0 || (*u & (*u - 1)) != 0)
      fail(path, "key 'general.alignment' is " + std::to_string(*u) + ", expected a power of two");
    f.alignment_ = *u;
  }

  // --- tensor infos ----------------------------------------------------------------------------
  f.tensors_.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = c.read_string("name of tensor #" + std::to_string(i), kMaxNameBytes);
    const std::string tq = "tensor " + quote_name(t.name);
    if (t.name.empty()) fail(path, "tensor #" + std::to_string(i) + " has an empty name");
    if (f.tensor_index_.count(t.name)) fail(path, tq + " appears twice");
    const uint32_t n_dims = c.read<uint32_t>("n_dims of " + tq);
    if (n_dims == 0 || n_dims > kMaxDims)
      fail(path, tq + ": n_dims is " + std::to_string(n_dims) + ", expected 1.." + std::to_string(kMaxDims));
    t.n_dims = static_cast<int>(n_dims);
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim = c.read<uint64_t>("dims of " + tq);
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(path, tq + ": dimension " + std::to_string(d) + " is " + std::to_string(dim) + ", above 2^63-1");
      t.dims[d] = static_cast<int64_t>(dim);
    }
    const uint32_t type = c.read<uint32_t>("type of " + tq);
    const gguf::BlockFormat* fmt = gguf::find_block_format(type);
    if (!fmt) fail(path, tq + ": GGML type code " + std::to_string(type) + " is not a known type");
    t.type = fmt->type;
    t.offset = c.read<uint64_t>("offset of " + tq);
    if (t.dims[0] % fmt->block_elems != 0)
      fail(path, tq + ": row length dims[0] = " + std::to_string(t.dims[0]) + " is not a multiple of " + fmt->name +
                     "'s block of " + std::to_string(fmt->block_elems) + " elements (dims " + dims_str(t) + ")");
    // bytes = dims[0] / block * block_bytes * dims[1] * dims[2] * dims[3], each step checked: a
    // hostile shape must not wrap to a small size. Zero dims give zero bytes, but the product of the
    // others must still fit (numel() multiplies in order).
    uint64_t bytes = static_cast<uint64_t>(t.dims[0]) / fmt->block_elems * fmt->block_bytes;
    uint64_t elems = static_cast<uint64_t>(t.dims[0]);
    for (int d = 1; d < kMaxDims; ++d) {
      const auto dim = static_cast<uint64_t>(t.dims[d]);
      if (__builtin_mul_overflow(bytes, dim, &bytes) || __builtin_mul_overflow(elems, dim, &elems) ||
          elems > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail(path, tq + ": dims " + dims_str(t) + " are too large (the size overflows 64 bits)");
    }
    t.bytes = bytes;
    if (t.offset % f.alignment_ != 0)
      fail(path, tq + ": offset " + std::to_string(t.offset) + " is not a multiple of the alignment " +
                     std::to_string(f.alignment_));
    f.tensor_index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }

  // --- data section ------------------------------------------------------------------------------
  const uint64_t header_end = c.pos();
  const uint64_t data_offset = (header_end + f.alignment_ - 1) / f.alignment_ * f.alignment_;  // no overflow: pos <= size
  if (data_offset > size && !f.tensors_.empty())
    fail(path, "the data section would start at byte " + std::to_string(data_offset) + " (header end " +
                   std::to_string(header_end) + " aligned to " + std::to_string(f.alignment_) + "), past the end of the " +
                   std::to_string(size) + "-byte file (truncated file?)");
  f.data_offset_ = std::min(data_offset, size);
  const uint64_t data_size = size - f.data_offset_;
  for (GgufTensorInfo& t : f.tensors_) {
    if (t.offset > data_size || t.bytes > data_size - t.offset)
      fail(path, "tensor " + quote_name(t.name) + ": bytes " + std::to_string(t.offset) + ".." +
                     std::to_string(t.offset) + "+" + std::to_string(t.bytes) + " (" + gguf::ggml_type_name(static_cast<uint32_t>(t.type)) +
                     " " + dims_str(t) + ") go beyond the data section of " + std::to_string(data_size) +
                     " bytes (truncated file?)");
    t.data = data + f.data_offset_ + t.offset;
  }
  std::vector<const GgufTensorInfo*> by_offset;
  for (const GgufTensorInfo& t : f.tensors_)
    if (t.bytes > 0) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo &a = *by_offset[i - 1], &b = *by_offset[i];
    if (b.offset < a.offset + a.bytes)
      fail(path, "tensors " + quote_name(a.name) + " (bytes " + std::to_string(a.offset) + ".." +
                     std::to_string(a.offset + a.bytes) + ") and " + quote_name(b.name) + " (bytes " +
                     std::to_string(b.offset) + ".." + std::to_string(b.offset + b.bytes) + ") overlap in the data section");
  }
  return f;
}

GgufFile GgufFile::open(const std::string& path) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, "GGUF file", &size);  // its errors name the file
  if (size < 4) {
    ::close(fd);
    fail(path, "file is " + std::to_string(size) + " bytes, shorter than the 4-byte magic");
  }
  void* base = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
  const int map_errno = errno;
  ::close(fd);  // the mapping keeps the file referenced
  if (base == MAP_FAILED) fail(path, std::string("cannot memory-map the file: ") + std::strerror(map_errno));
  const size_t length = static_cast<size_t>(size);
  std::shared_ptr<void> mapping(base, [length](void* p) { ::munmap(p, length); });
  GgufFile f = parse_gguf(path, static_cast<const std::byte*>(base), size);
  f.mapping_ = std::move(mapping);
  return f;
}

const GgufValue* GgufFile::find(const std::string& key) const {
  auto it = key_index_.find(key);
  return it == key_index_.end() ? nullptr : &metadata_[it->second].second;
}

namespace {
const GgufValue& require(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.find(key);
  if (!v) fail(f.path(), "no key " + quote_name(key));
  return *v;
}
}  // namespace

uint64_t GgufFile::get_uint(const std::string& key) const {
  const GgufValue& v = require(*this, key);
  if (const auto* u = std::get_if<uint64_t>(&v.value)) return *u;
  if (const auto* i = std::get_if<int64_t>(&v.value); i && *i >= 0) return static_cast<uint64_t>(*i);
  fail(path_, "key " + quote_name(key) + " is " + v.describe() + ", expected a non-negative integer");
}

const std::string& GgufFile::get_string(const std::string& key) const {
  const GgufValue& v = require(*this, key);
  if (const auto* s = std::get_if<std::string>(&v.value)) return *s;
  fail(path_, "key " + quote_name(key) + " is " + v.describe() + ", expected a string");
}

double GgufFile::get_float(const std::string& key) const {
  const GgufValue& v = require(*this, key);
  if (const auto* d = std::get_if<double>(&v.value)) return *d;
  fail(path_, "key " + quote_name(key) + " is " + v.describe() + ", expected f32 or f64");
}

const GgufTensorInfo* GgufFile::find_tensor(const std::string& name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensorInfo& GgufFile::tensor(const std::string& name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t) fail(path_, "no tensor named " + quote_name(name) + " (the file has " + std::to_string(tensors_.size()) + ")");
  return *t;
}

// --- split files -----------------------------------------------------------------------------------

GgufSplitName parse_gguf_split_name(const std::string& path) {
  // NAME-%05d-of-%05d.gguf (llama.cpp's llama_split_path / gguf-py's SHARD_NAME_FORMAT)
  constexpr std::string_view kSuffix = ".gguf";
  if (path.size() < 20 + kSuffix.size() || path.compare(path.size() - kSuffix.size(), kSuffix.size(), kSuffix) != 0)
    return {};
  const std::string stem = path.substr(0, path.size() - kSuffix.size());
  const std::string tail = stem.substr(stem.size() - 15);  // "-00001-of-00003"
  auto digits = [](const std::string& s) { return std::all_of(s.begin(), s.end(), [](char ch) { return ch >= '0' && ch <= '9'; }); };
  if (tail[0] != '-' || tail.compare(6, 4, "-of-") != 0 || !digits(tail.substr(1, 5)) || !digits(tail.substr(10, 5)))
    return {};
  return {stem.substr(0, stem.size() - 15), std::stoi(tail.substr(1, 5)), std::stoi(tail.substr(10, 5))};
}

std::string gguf_split_path(const std::string& prefix, int no, int count) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "-%05d-of-%05d.gguf", no, count);
  return prefix + buf;
}

GgufModel GgufModel::open(const std::string& path) {
  GgufModel m;
  GgufFile first = GgufFile::open(path);
  const GgufSplitName name = parse_gguf_split_name(path);
  const GgufValue* count_v = first.find("split.count");
  if (!count_v) {
    if (name.count > 1)
      fail(path, "the name says part " + std::to_string(name.no) + " of " + std::to_string(name.count) +
                     " but the file has no key 'split.count'");
    m.files_.push_back(std::move(first));
  } else {
    const uint64_t count = first.get_uint("split.count");
    if (count == 0 || count > 99999) fail(path, "key 'split.count' is " + std::to_string(count) + ", expected 1..99999");
    if (count > 1 && name.count == 0)
      fail(path, "key 'split.count' is " + std::to_string(count) +
                     " but the file name is not of the form NAME-00001-of-" + gguf_split_path("", 0, static_cast<int>(count)).substr(10));
    if (count > 1 && static_cast<uint64_t>(name.count) != count)
      fail(path, "key 'split.count' is " + std::to_string(count) + " but the file name says " + std::to_string(name.count) + " parts");
    for (uint64_t i = 0; i < count; ++i) {
      const std::string part = count == 1 ? path : gguf_split_path(name.prefix, static_cast<int>(i + 1), static_cast<int>(count));
      GgufFile f = (count == 1 || static_cast<int>(i + 1) == name.no) ? std::move(first) : GgufFile::open(part);
      const uint64_t no = f.get_uint("split.no");
      if (no != i) fail(part, "key 'split.no' is " + std::to_string(no) + ", expected " + std::to_string(i) + " (0-based part number)");
      const uint64_t c = f.get_uint("split.count");
      if (c != count) fail(part, "key 'split.count' is " + std::to_string(c) + ", expected " + std::to_string(count) + " as in " + quote_name(path));
      m.files_.push_back(std::move(f));
    }
    const uint64_t total = m.files_.front().get_uint("split.tensors.count");
    uint64_t have = 0;
    for (const GgufFile& f : m.files_) have += f.tensors().size();
    if (have != total)
      fail(m.files_.front().path(), "key 'split.tensors.count' is " + std::to_string(total) + " but the " +
                                        std::to_string(count) + " parts hold " + std::to_string(have) + " tensors");
    for (const GgufFile& f : m.files_)
      if (f.find("split.tensors.count") && f.get_uint("split.tensors.count") != total)
        fail(f.path(), "key 'split.tensors.count' is " + std::to_string(f.get_uint("split.tensors.count")) +
                           ", expected " + std::to_string(total) + " as in the first part");
  }
  for (size_t fi = 0; fi < m.files_.size(); ++fi) {
    const auto& ts = m.files_[fi].tensors();
    for (size_t ti = 0; ti < ts.size(); ++ti) {
      auto [it, inserted] = m.by_name_.emplace(ts[ti].name, std::make_pair(fi, ti));
      if (!inserted)
        fail(m.files_[fi].path(), "tensor " + quote_name(ts[ti].name) + " is also in " + quote_name(m.files_[it->second.first].path()));
    }
  }
  return m;
}

const GgufTensorInfo* GgufModel::find_tensor(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &files_[it->second.first].tensors()[it->second.second];
}

const GgufTensorInfo& GgufModel::tensor(const std::string& name) const {
  const GgufTensorInfo* t = find_tensor(name);
  if (!t) fail(main().path(), "no tensor named " + quote_name(name) + " in the model's " + std::to_string(files_.size()) + " file(s)");
  return *t;
}

}  // namespace hanpu
