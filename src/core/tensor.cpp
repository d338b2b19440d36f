#include "hanpu/tensor.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>
#include <sstream>
#include <utility>

#ifdef __linux__
#include <sys/mman.h>
#endif

namespace hanpu {

size_t dtype_size(DType dt) {
  switch (dt) {
    case DType::F32: return 4;
    case DType::F16: return 2;
    case DType::BF16: return 2;
    case DType::F64: return 8;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::I8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dt) {
  switch (dt) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::I8: return "I8";
  }
  return "?";
}

DType dtype_from_name(const std::string& name) {
  for (DType d : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I32, DType::I64, DType::I8})
    if (name == dtype_name(d)) return d;
  throw Error("unknown dtype '" + name + "' (expected one of F32, F16, BF16, F64, I32, I64, I8)");
}

bool TensorView::is_contiguous() const {
  int64_t expect = 1;
  for (int i = rank - 1; i >= 0; --i) {
    if (shape[i] != 1 && stride[i] != expect) return false;
    expect *= shape[i];
  }
  return true;
}

std::string TensorView::shape_str() const {
  std::ostringstream os;
  os << '[';
  for (int i = 0; i < rank; ++i) os << (i ? "," : "") << shape[i];
  os << ']';
  return os.str();
}

TensorView TensorView::contiguous(void* data, DType dtype, const std::vector<int64_t>& shape) {
  if (shape.size() > static_cast<size_t>(kMaxRank)) throw Error("tensor rank above 5 is not supported");
  TensorView t;
  t.data = data;
  t.dtype = dtype;
  t.rank = static_cast<int>(shape.size());
  int64_t s = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.stride[i] = s;
    s *= shape[i];
  }
  return t;
}

TensorView TensorView::contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape) {
  return contiguous(data, dtype, std::vector<int64_t>(shape));
}

namespace {
constexpr size_t kHugePage = size_t{2} << 20;
}

// Buffers of 2 MiB and more are their own anonymous mappings, not heap blocks: freeing one gives
// its pages back to the system at once. (From the heap, glibc raises its mmap threshold to the size
// of each large block freed, so the next blocks of that size come from the heap and freed ones stay
// resident as holes: a synthetic model that frees the parts of its stacked projections after
// copying them peaked 260 MiB higher, docs/LINEAR.md.) Fresh mappings read as zeros.
namespace {
bool mapped_size(size_t bytes) { return bytes >= kHugePage; }

std::byte* allocate(size_t bytes) {
  if (!mapped_size(bytes)) {
    // Zero bytes still get a (64-byte) allocation: a zero-element tensor is present, not absent.
    const size_t rounded = std::max<size_t>(64, (bytes + 63) / 64 * 64);
    auto* p = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
    if (!p) throw std::bad_alloc();
    std::memset(p, 0, bytes);
    return p;
  }
  // Map one huge page more than needed and unmap the unaligned head and the tail.
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* raw = mmap(nullptr, rounded + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > base) munmap(raw, aligned - base);
  const uintptr_t end = base + rounded + kHugePage;
  if (end > aligned + rounded) munmap(reinterpret_cast<void*>(aligned + rounded), end - (aligned + rounded));
#if defined(MADV_HUGEPAGE)
  madvise(reinterpret_cast<void*>(aligned), rounded, MADV_HUGEPAGE);  // a hint: failure is harmless
#endif
  return reinterpret_cast<std::byte*>(aligned);
}

void deallocate(std::byte* p, size_t bytes) {
  if (!p) return;
  if (mapped_size(bytes)) munmap(p, (bytes + kHugePage - 1) / kHugePage * kHugePage);
  else std::free(p);
}
}  // namespace

ByteBuffer::ByteBuffer(size_t bytes) : data_(allocate(bytes)), size_(bytes) {}

ByteBuffer::ByteBuffer(const ByteBuffer& other) : ByteBuffer(other.size_) {
  if (!other.data_) {  // copying a moved-from buffer
    deallocate(data_, size_);
    data_ = nullptr;
    return;
  }
  if (size_) std::memcpy(data_, other.data_, size_);
}

ByteBuffer& ByteBuffer::operator=(const ByteBuffer& other) {
  if (this != &other) *this = ByteBuffer(other);
  return *this;
}

ByteBuffer::ByteBuffer(ByteBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

ByteBuffer& ByteBuffer::operator=(ByteBuffer&& other) noexcept {
  if (this != &other) {
    deallocate(data_, size_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

ByteBuffer::~ByteBuffer() { deallocate(data_, size_); }

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  int64_t n = 1;
  for (int64_t d : shape_) {
    if (d < 0) throw Error("negative tensor dimension");
    n *= d;
  }
  storage_ = ByteBuffer(static_cast<size_t>(n) * dtype_size(dtype_));
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape_) n *= d;
  return n;
}

TensorView Tensor::view() const {
  return TensorView::contiguous(const_cast<std::byte*>(storage_.data()), dtype_, shape_);
}

double Tensor::get(int64_t i) const { return load_as_double(storage_.data(), dtype_, i); }
void Tensor::set(int64_t i, double v) { store_from_double(storage_.data(), dtype_, i, v); }

float bf16_to_f32(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: renormalise
      int e = -1;
      do {
        ++e;
        mant <<= 1;
      } while ((mant & 0x400u) == 0);
      u = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3ffu) << 13;
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | mant << 13;
  } else {
    u = sign | (exp + 112) << 23 | mant << 13;
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t absu = u & 0x7fffffffu;
  if (absu > 0x7f800000u) return sign | 0x7e00u;               // NaN
  if (absu >= 0x477ff000u) return sign | 0x7c00u;              // rounds to inf (>= 65520)
  if (absu < 0x38800000u) {                                    // subnormal or zero in f16
    if (absu < 0x33000000u) return sign;                       // below half the smallest subnormal
    const uint32_t exp = absu >> 23;
    const uint32_t mant = (absu & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - exp;  // 14 + (113 - exp) - 1 ... bits to drop
    uint32_t r = mant >> (shift);
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = absu - 0x38000000u;  // rebias exponent 127 -> 15
  r += 0xfffu + ((r >> 13) & 1u);
  return sign | static_cast<uint16_t>(r >> 13);
}

double load_as_double(const void* base, DType dt, int64_t i) {
  switch (dt) {
    case DType::F32: return static_cast<const float*>(base)[i];
    case DType::F64: return static_cast<const double*>(base)[i];
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(base)[i]);
    case DType::I32: return static_cast<const int32_t*>(base)[i];
    case DType::I64: return static_cast<double>(static_cast<const int64_t*>(base)[i]);
    case DType::I8: return static_cast<const int8_t*>(base)[i];
  }
  return 0.0;
}

void store_from_double(void* base, DType dt, int64_t i, double v) {
  switch (dt) {
    case DType::F32: static_cast<float*>(base)[i] = static_cast<float>(v); break;
    case DType::F64: static_cast<double*>(base)[i] = v; break;
    case DType::F16: static_cast<uint16_t*>(base)[i] = f32_to_f16(static_cast<float>(v)); break;
    case DType::BF16: static_cast<uint16_t*>(base)[i] = f32_to_bf16(static_cast<float>(v)); break;
    case DType::I32: static_cast<int32_t*>(base)[i] = static_cast<int32_t>(v); break;
    case DType::I64: static_cast<int64_t*>(base)[i] = static_cast<int64_t>(v); break;
    case DType::I8: static_cast<int8_t*>(base)[i] = static_cast<int8_t>(v); break;
  }
}

}  // namespace hanpu
