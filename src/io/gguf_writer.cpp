// GGUF writer (gguf_writer.hpp). Little-endian, GGUF version 3: magic "GGUF", u32 version,
// u64 tensor count, u64 key/value count; each key a u64-length string, a u32 value type and the
// value (arrays: u32 element type, u64 count, elements); each tensor info the name, u32 n_dims,
// u64 dims, u32 ggml type, u64 offset relative to the aligned start of the data section.
#include "io/gguf_writer.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <unistd.h>

#include "hanpu/tensor.hpp"
#include "io/file_io.hpp"

namespace hanpu {

namespace {

template <class T>
void put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

void put_string(std::string& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out += s;
}

}  // namespace

void GgufWriter::key(const std::string& k, GgufType t) {
  if (std::find(keys_.begin(), keys_.end(), k) != keys_.end()) throw Error("GGUF writer: key '" + k + "' written twice");
  keys_.push_back(k);
  put_string(kv_, k);
  put<uint32_t>(kv_, static_cast<uint32_t>(t));
  ++kv_count_;
}

void GgufWriter::add_u32(const std::string& k, uint32_t v) { key(k, GgufType::U32); put(kv_, v); }
void GgufWriter::add_i32(const std::string& k, int32_t v) { key(k, GgufType::I32); put(kv_, v); }
void GgufWriter::add_f32(const std::string& k, float v) { key(k, GgufType::F32); put(kv_, v); }
void GgufWriter::add_bool(const std::string& k, bool v) { key(k, GgufType::BOOL); put<uint8_t>(kv_, v ? 1 : 0); }
void GgufWriter::add_string(const std::string& k, const std::string& v) { key(k, GgufType::STRING); put_string(kv_, v); }

void GgufWriter::add_strings(const std::string& k, const std::vector<std::string>& v) {
  key(k, GgufType::ARRAY);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::STRING));
  put<uint64_t>(kv_, v.size());
  for (const std::string& s : v) put_string(kv_, s);
}

void GgufWriter::add_i32s(const std::string& k, const std::vector<int32_t>& v) {
  key(k, GgufType::ARRAY);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::I32));
  put<uint64_t>(kv_, v.size());
  for (int32_t x : v) put(kv_, x);
}

void GgufWriter::add_bools(const std::string& k, const std::vector<bool>& v) {
  key(k, GgufType::ARRAY);
  put<uint32_t>(kv_, static_cast<uint32_t>(GgufType::BOOL));
  put<uint64_t>(kv_, v.size());
  for (bool x : v) put<uint8_t>(kv_, x ? 1 : 0);
}

void GgufWriter::add_tensor(const std::string& name, gguf::GgmlType type, const std::vector<int64_t>& dims,
                            std::vector<uint8_t> data) {
  for (const Tensor& t : tensors_)
    if (t.name == name) throw Error("GGUF writer: tensor '" + name + "' written twice");
  const gguf::BlockFormat& f = gguf::block_format(type);
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  if (dims.empty() || dims.size() > 4 || dims[0] % f.block_elems != 0 ||
      data.size() != static_cast<size_t>(n / f.block_elems) * f.block_bytes)
    throw Error("GGUF writer: tensor '" + name + "' of type " + f.name + ": " + std::to_string(data.size()) +
                " bytes for " + std::to_string(n) + " elements in " + std::to_string(dims.size()) +
                " dims, expected rows of whole blocks of " + std::to_string(f.block_elems));
  tensors_.push_back({name, type, dims, std::move(data)});
}

template <class Sink>
void GgufWriter::emit(Sink&& sink) const {
  std::string head;
  head += "GGUF";
  put<uint32_t>(head, 3);
  put<uint64_t>(head, tensors_.size());
  put<uint64_t>(head, kv_count_);
  head += kv_;
  uint64_t offset = 0;
  const auto align = [](uint64_t x) { return (x + kAlignment - 1) / kAlignment * kAlignment; };
  for (const Tensor& t : tensors_) {
    put_string(head, t.name);
    put<uint32_t>(head, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) put<uint64_t>(head, static_cast<uint64_t>(d));
    put<uint32_t>(head, static_cast<uint32_t>(t.type));
    put<uint64_t>(head, offset);
    offset = align(offset + t.data.size());
  }
  head.resize(align(head.size()), '\0');
  sink(head.data(), head.size());
  const std::string pad(kAlignment, '\0');
  for (const Tensor& t : tensors_) {
    sink(t.data.data(), t.data.size());
    sink(pad.data(), align(t.data.size()) - t.data.size());
  }
}

void GgufWriter::write(const std::string& path) const {
  AtomicFile out(path);
  emit([&](const void* p, size_t n) { out.write(p, n); });
  out.commit();
}

void GgufWriter::write_fd(int fd, const std::string& what) const {
  emit([&](const void* p, size_t n) {
    const char* c = static_cast<const char*>(p);
    while (n > 0) {
      const ssize_t w = ::write(fd, c, n);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) throw Error("writing " + what + ": " + std::strerror(errno));
      c += w;
      n -= static_cast<size_t>(w);
    }
  });
}

}  // namespace hanpu
