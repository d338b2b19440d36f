#include "io/safetensors.hpp"

#include <algorithm>
#include <bit>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <new>
#include <set>
#include <system_error>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cerrno>

#include <nlohmann/json.hpp>

#include "io/file_io.hpp"
#include "io/json_io.hpp"

namespace hanpu {

// Safetensors is little-endian and we hand out views of the file bytes as-is.
static_assert(std::endian::native == std::endian::little, "hanpu's safetensors I/O assumes a little-endian host");

namespace {

using json = nlohmann::json;

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // real headers are kilobytes; more is a broken file
constexpr size_t kBufferAlignment = 64;             // cache line; also enough for every dtype
// A valid header nests objects/arrays 3 deep ({name: {shape: [...]}}); anything much deeper is not
// safetensors and is refused before parsing so a hostile file cannot exhaust the stack.
constexpr int kMaxHeaderJsonDepth = 16;

// Names come from files: control characters are escaped so a name cannot forge output lines.
std::string quoted(const std::string& s) { return "'" + printable(s) + "'"; }

[[noreturn]] void fail(const std::string& path, const std::string& what) {
  throw Error("safetensors file " + quoted(path) + ": " + what);
}
[[noreturn]] void fail_tensor(const std::string& path, const std::string& name, const std::string& what) {
  fail(path, "tensor " + quoted(name) + ": " + what);
}

std::byte* aligned_alloc_bytes(size_t n) {
  // At least one alignment unit so that even an empty data section gives a non-null pointer:
  // TensorView treats data == nullptr as "absent", and zero-element tensors are not absent.
  const size_t size = std::max(n, kBufferAlignment);
  return static_cast<std::byte*>(::operator new(size, std::align_val_t{kBufferAlignment}));
}

// Returns the maximum nesting depth of JSON arrays/objects in `text`, ignoring brackets inside
// strings. Stops counting early once `limit` is exceeded.
int json_nesting_depth(const std::string& text, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    else if (c == '{' || c == '[') {
      max_depth = std::max(max_depth, ++depth);
      if (max_depth > limit) return max_depth;
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  return max_depth;
}

const char* json_kind(const json& j) { return j.type_name(); }

// Reads a JSON value that must be a non-negative integer fitting in int64 (dims and offsets).
// Returns false with `why` set otherwise.
bool as_non_negative_int(const json& j, uint64_t& out, std::string& why) {
  if (j.is_number_unsigned()) {
    out = j.get<uint64_t>();
    if (out > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      why = "too large (" + std::to_string(out) + ")";
      return false;
    }
    return true;
  }
  if (j.is_number_integer()) {  // signed and not unsigned: negative
    why = "negative (" + std::to_string(j.get<int64_t>()) + ")";
    return false;
  }
  why = std::string("not an integer (found ") + json_kind(j) + " " + j.dump() + ")";
  return false;
}

const char* const kSafetensorsDtypesHanpuRejects[] = {"BOOL", "U8",  "I16",     "U16",
                                                      "U32",  "U64", "F8_E4M3", "F8_E5M2", "F8_E8M0",
                                                      "F6_E2M3", "F6_E3M2", "F4", "C64"};

DType parse_dtype(const std::string& path, const std::string& name, const json& j) {
  if (!j.is_string())
    fail_tensor(path, name, std::string("\"dtype\" must be a string, found ") + json_kind(j) + " " + j.dump());
  const std::string dt = j.get<std::string>();
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::I8})
    if (dt == dtype_name(d)) return d;
  const bool known = std::find(std::begin(kSafetensorsDtypesHanpuRejects), std::end(kSafetensorsDtypesHanpuRejects),
                               dt) != std::end(kSafetensorsDtypesHanpuRejects);
  fail_tensor(path, name,
              "dtype " + quoted(dt) +
                  (known ? " is a valid safetensors dtype but is not supported by hanpu" : " is not a known dtype") +
                  " (expected one of F32, F16, BF16, F64, I32, I64, I8)");
}

// Copies a strided view element by element into `dst` (contiguous, row-major).
void gather_contiguous(const TensorView& v, std::byte* dst) {
  const size_t esize = dtype_size(v.dtype);
  const int64_t n = v.numel();
  if (n == 0) return;
  if (v.is_contiguous()) {
    std::memcpy(dst, v.data, static_cast<size_t>(n) * esize);
    return;
  }
  const auto* src = static_cast<const std::byte*>(v.data);
  std::array<int64_t, kMaxRank> index{};
  const int inner = v.rank - 1;  // rank >= 1 here: a rank-0 view is always contiguous
  const int64_t inner_len = v.shape[inner], inner_stride = v.stride[inner];
  for (int64_t done = 0; done < n; done += inner_len) {
    int64_t base = 0;
    for (int d = 0; d < inner; ++d) base += index[d] * v.stride[d];
    for (int64_t i = 0; i < inner_len; ++i) {
      std::memcpy(dst, src + (base + i * inner_stride) * static_cast<int64_t>(esize), esize);
      dst += esize;
    }
    for (int d = inner - 1; d >= 0; --d) {  // odometer over the outer dimensions
      if (++index[d] < v.shape[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

void SafetensorsFile::AlignedFree::operator()(std::byte* p) const {
  ::operator delete(p, std::align_val_t{kBufferAlignment});
}

SafetensorsFile SafetensorsFile::open(const std::string& path) { return open_impl(path, false); }
SafetensorsFile SafetensorsFile::map(const std::string& path) { return open_impl(path, true); }

void SafetensorsFile::prefault(const std::function<void(uint64_t, uint64_t)>& progress) const {
  if (!mapped_data_) return;
  // 64 MiB steps: small enough for a smooth progress bar, large enough that the callback costs
  // nothing next to the page reads.
  constexpr uint64_t kStep = 64ull << 20;
  constexpr uint64_t kPage = 4096;
  volatile std::byte sink{};
  for (uint64_t done = 0; done < data_bytes_;) {
    const uint64_t end = std::min(data_bytes_, done + kStep);
    for (uint64_t i = done; i < end; i += kPage) sink = mapped_data_[i];
    done = end;
    if (progress) progress(done, data_bytes_);
  }
  (void)sink;
}

SafetensorsFile SafetensorsFile::open_impl(const std::string& path, bool mapped) {
  SafetensorsFile file;
  file.path_ = path;

  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) fail(path, "file does not exist");
  if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory, expected a file");
  // A FIFO or device must not block the open below: check it is a regular file first.
  try {
    ::close(open_regular_file(path, "safetensors file", nullptr));
  } catch (const Error& e) {
    fail(path, e.what());
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open for reading");
  in.seekg(0, std::ios::end);
  const std::streamoff file_size_signed = in.tellg();
  if (file_size_signed < 0) fail(path, "cannot determine the file size");
  const uint64_t file_size = static_cast<uint64_t>(file_size_signed);
  in.seekg(0, std::ios::beg);

  if (file_size < 8)
    fail(path, "file is " + std::to_string(file_size) + " bytes, shorter than the 8-byte header length field");
  unsigned char length_bytes[8];
  if (!in.read(reinterpret_cast<char*>(length_bytes), 8)) fail(path, "cannot read the header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = header_len << 8 | length_bytes[i];
  if (header_len > kMaxHeaderBytes)
    fail(path, "header length " + std::to_string(header_len) + " bytes is absurd (limit " +
                   std::to_string(kMaxHeaderBytes) + "); not a safetensors file?");
  if (header_len > file_size - 8)
    fail(path, "header length " + std::to_string(header_len) + " exceeds the " + std::to_string(file_size - 8) +
                   " bytes that follow it (truncated file?)");

  std::string header_text(header_len, '\0');
  if (!in.read(header_text.data(), static_cast<std::streamsize>(header_len))) fail(path, "cannot read the header");
  if (json_nesting_depth(header_text, kMaxHeaderJsonDepth) > kMaxHeaderJsonDepth)
    fail(path, "header JSON is nested deeper than " + std::to_string(kMaxHeaderJsonDepth) + " levels; not a safetensors header");
  // Duplicate tensor names are rejected here (nlohmann would keep the last one silently).
  JsonReadOptions jopt;
  jopt.max_depth = kMaxHeaderJsonDepth;
  const json header = parse_json(header_text, "safetensors file " + quoted(path) + ": header", jopt);
  if (!header.is_object()) fail(path, std::string("header must be a JSON object, found ") + json_kind(header));

  const uint64_t data_size = file_size - 8 - header_len;

  // --- validate every entry before touching the data -------------------------------------------
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& entry = it.value();
    if (name == "__metadata__") {
      if (!entry.is_object())
        fail(path, std::string("\"__metadata__\" must be an object of strings, found ") + json_kind(entry));
      for (auto m = entry.begin(); m != entry.end(); ++m) {
        if (!m.value().is_string())
          fail(path, "\"__metadata__\" value for key " + quoted(m.key()) + " must be a string, found " +
                         json_kind(m.value()));
        file.metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!entry.is_object())
      fail_tensor(path, name, std::string("entry must be an object with dtype/shape/data_offsets, found ") +
                                  json_kind(entry));
    for (const char* field : {"dtype", "shape", "data_offsets"})
      if (!entry.contains(field)) fail_tensor(path, name, std::string("entry has no \"") + field + "\"");

    Entry e;
    e.dtype = parse_dtype(path, name, entry["dtype"]);

    const json& shape = entry["shape"];
    if (!shape.is_array())
      fail_tensor(path, name, std::string("\"shape\" must be an array, found ") + json_kind(shape) + " " + shape.dump());
    if (shape.size() > static_cast<size_t>(kMaxRank))
      fail_tensor(path, name, "rank " + std::to_string(shape.size()) + " is above hanpu's maximum of " +
                                  std::to_string(kMaxRank) + " (shape " + shape.dump() + ")");
    // The size is computed with overflow checks: a hostile shape like [2^40, 2^40] must not wrap
    // around to a small byte count that happens to match data_offsets. Zero dims are skipped in
    // the check but the remaining product must still fit, because TensorView::numel() multiplies
    // the dims in order and would overflow on [2^40, 2^40, 0] before reaching the zero.
    uint64_t nonzero_bytes = dtype_size(e.dtype);
    bool has_zero_dim = false;
    for (size_t d = 0; d < shape.size(); ++d) {
      uint64_t dim = 0;
      std::string why;
      if (!as_non_negative_int(shape[d], dim, why))
        fail_tensor(path, name, "shape " + shape.dump() + ": dimension " + std::to_string(d) + " is " + why);
      e.shape.push_back(static_cast<int64_t>(dim));
      if (dim == 0) {
        has_zero_dim = true;
        continue;
      }
      if (__builtin_mul_overflow(nonzero_bytes, dim, &nonzero_bytes) ||
          nonzero_bytes > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        fail_tensor(path, name, "shape " + shape.dump() + " is too large (its byte size overflows 64 bits)");
    }
    const uint64_t expected_bytes = has_zero_dim ? 0 : nonzero_bytes;

    const json& offsets = entry["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2)
      fail_tensor(path, name, "\"data_offsets\" must be [begin, end], found " + offsets.dump());
    uint64_t begin = 0, end = 0;
    std::string why;
    if (!as_non_negative_int(offsets[0], begin, why))
      fail_tensor(path, name, "data_offsets begin is " + why);
    if (!as_non_negative_int(offsets[1], end, why)) fail_tensor(path, name, "data_offsets end is " + why);
    if (begin > end)
      fail_tensor(path, name, "data_offsets " + offsets.dump() + " have begin > end");
    if (end - begin != expected_bytes)
      fail_tensor(path, name, "data_offsets " + offsets.dump() + " span " + std::to_string(end - begin) +
                                  " bytes, expected " + std::to_string(expected_bytes) + " for dtype " +
                                  dtype_name(e.dtype) + " and shape " + shape.dump());
    if (end > data_size)
      fail_tensor(path, name, "data_offsets " + offsets.dump() + " go beyond the data section of " +
                                  std::to_string(data_size) + " bytes (truncated file?)");
    e.begin = begin;
    e.bytes = expected_bytes;
    file.entries_.emplace(name, std::move(e));
  }

  // --- no two tensors may share bytes ---------------------------------------------------------
  struct Range {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;
  for (const auto& [name, e] : file.entries_)
    if (e.bytes > 0) ranges.push_back({e.begin, e.begin + e.bytes, &name});  // empty ranges overlap nothing
  std::sort(ranges.begin(), ranges.end(), [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].begin < ranges[i - 1].end)
      fail(path, "tensors " + quoted(*ranges[i - 1].name) + " (bytes " + std::to_string(ranges[i - 1].begin) + ".." +
                     std::to_string(ranges[i - 1].end) + ") and " + quoted(*ranges[i].name) + " (bytes " +
                     std::to_string(ranges[i].begin) + ".." + std::to_string(ranges[i].end) +
                     ") overlap in the data section");

  file.data_bytes_ = data_size;
  std::byte* section = nullptr;
  if (mapped) {
    in.close();
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path, std::string("cannot open for mapping: ") + std::strerror(errno));
    void* base = ::mmap(nullptr, static_cast<size_t>(file_size), PROT_READ, MAP_SHARED, fd, 0);
    const int map_errno = errno;
    ::close(fd);  // the mapping keeps the file referenced
    if (base == MAP_FAILED) fail(path, std::string("cannot memory-map the file: ") + std::strerror(map_errno));
    const size_t length = static_cast<size_t>(file_size);
    file.mapping_ = std::shared_ptr<void>(base, [length](void* p) { ::munmap(p, length); });
    // Checkpoint weights are read front to back once per forward pass.
    ::madvise(base, length, MADV_WILLNEED);
    section = static_cast<std::byte*>(base) + 8 + header_len;
    file.mapped_data_ = section;
  } else {
    // --- read the data section into aligned memory -------------------------------------------
    try {
      if (data_size > static_cast<uint64_t>(std::numeric_limits<std::streamsize>::max()))
        fail(path, "data section too large");
      file.data_.reset(aligned_alloc_bytes(static_cast<size_t>(data_size)));
    } catch (const std::bad_alloc&) {
      fail(path, "cannot allocate " + std::to_string(data_size) + " bytes for the data section");
    }
    if (data_size > 0 && !in.read(reinterpret_cast<char*>(file.data_.get()), static_cast<std::streamsize>(data_size)))
      fail(path, "cannot read the data section (" + std::to_string(data_size) + " bytes)");
    section = file.data_.get();
  }

  // The read data section starts 64-byte aligned, and a mapped one at 8 + header length from a
  // page boundary; a tensor is aligned iff its address is a multiple of its element size. Writers
  // normally guarantee that, but the format does not require it.
  for (auto& [name, e] : file.entries_) {
    const size_t esize = dtype_size(e.dtype);
    std::byte* in_file = section + e.begin;
    if (reinterpret_cast<uintptr_t>(in_file) % esize == 0) {
      e.data = in_file;
      continue;
    }
    e.own_copy.reset(aligned_alloc_bytes(e.bytes));
    std::memcpy(e.own_copy.get(), in_file, e.bytes);
    e.data = e.own_copy.get();
  }
  return file;
}

bool SafetensorsFile::has(const std::string& name) const { return entries_.count(name) != 0; }

void SafetensorsFile::release_pages(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw Error("'" + path_ + "': no tensor '" + name + "' to release");
  const Entry& e = it->second;
  if (!mapping_ || e.own_copy || e.bytes == 0) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(e.data), end = begin + e.bytes;
  const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;  // whole pages only
  if (last > first) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

TensorView SafetensorsFile::get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    std::string available;
    for (const std::string& n : names()) available += (available.empty() ? "" : ", ") + n;
    fail(path_, "no tensor named " + quoted(name) + " (the file has: " + (available.empty() ? "none" : available) + ")");
  }
  return TensorView::contiguous(it->second.data, it->second.dtype, it->second.shape);
}

Tensor SafetensorsFile::load_copy(const std::string& name) const { return copy_to_tensor(get(name)); }

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::pair<uint64_t, std::string>> by_offset;
  for (const auto& [name, e] : entries_) by_offset.emplace_back(e.begin, name);
  std::sort(by_offset.begin(), by_offset.end());
  std::vector<std::string> out;
  for (auto& [offset, name] : by_offset) out.push_back(std::move(name));
  return out;
}

Tensor copy_to_tensor(const TensorView& view) {
  std::vector<int64_t> shape(view.shape.begin(), view.shape.begin() + view.rank);
  Tensor t(view.dtype, shape);
  if (t.numel() > 0) gather_contiguous(view, static_cast<std::byte*>(t.data()));
  return t;
}

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, TensorView>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const auto& [name, v] : tensors) {
    if (name.empty()) fail(path, "cannot write a tensor with an empty name");
    if (name == "__metadata__") fail(path, "\"__metadata__\" is reserved and cannot be a tensor name");
    if (!seen.insert(name).second) fail_tensor(path, name, "name given twice");
    if (v.rank < 0 || v.rank > kMaxRank) fail_tensor(path, name, "invalid rank " + std::to_string(v.rank));
    json shape = json::array();
    for (int d = 0; d < v.rank; ++d) {
      if (v.shape[d] < 0) fail_tensor(path, name, "negative dimension in shape " + v.shape_str());
      shape.push_back(v.shape[d]);
    }
    const uint64_t bytes = static_cast<uint64_t>(v.numel()) * dtype_size(v.dtype);
    if (bytes > 0 && v.data == nullptr) fail_tensor(path, name, "view has no data (shape " + v.shape_str() + ")");
    header[name] = {{"dtype", dtype_name(v.dtype)}, {"shape", shape}, {"data_offsets", json::array({offset, offset + bytes})}};
    offset += bytes;
  }
  if (!metadata.empty()) {
    json meta = json::object();
    for (const auto& [k, val] : metadata) meta[k] = val;
    header["__metadata__"] = meta;
  }
  std::string header_text = header.dump();
  // Pad with spaces (allowed by the format) so the data section starts 8-byte aligned in the file,
  // which keeps every tensor aligned for readers that mmap it.
  header_text.append((8 - (8 + header_text.size()) % 8) % 8, ' ');

  // A unique temporary file beside the target, fsync'ed and renamed over it (io/file_io.hpp): a
  // failed write leaves the old file, and two writers of one output never mix their bytes.
  AtomicFile out(path);
  unsigned char length_bytes[8];
  const uint64_t len = header_text.size();
  for (int i = 0; i < 8; ++i) length_bytes[i] = static_cast<unsigned char>(len >> (8 * i));
  out.write(length_bytes, 8);
  out.write(header_text);
  std::vector<std::byte> scratch;
  for (const auto& [name, v] : tensors) {
    const size_t bytes = static_cast<size_t>(v.numel()) * dtype_size(v.dtype);
    if (bytes == 0) continue;
    const std::byte* src = static_cast<const std::byte*>(v.data);
    if (!v.is_contiguous()) {
      scratch.resize(bytes);
      gather_contiguous(v, scratch.data());
      src = scratch.data();
    }
    out.write(src, bytes);
  }
  out.commit();
}

}  // namespace hanpu
