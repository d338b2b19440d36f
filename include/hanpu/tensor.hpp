// Tensor views and owned tensors: the currency of the public API.
//
// A TensorView does not own memory. Shapes and strides are in elements (not bytes), row-major by
// default, at most 5 dimensions (the largest tensor in the API is the state [N,HV,K,V]).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <vector>

namespace hanpu {

enum class DType { F32, F16, BF16, F64, I32, I64, I8 };  // I8: int8 weights (hanpu quantize)

/// Size of one element in bytes.
size_t dtype_size(DType dt);
/// Safetensors-style name: "F32", "F16", "BF16", "F64", "I32", "I64", "I8".
const char* dtype_name(DType dt);
/// Inverse of dtype_name; throws hanpu::Error for an unknown name.
DType dtype_from_name(const std::string& name);
inline bool is_float(DType dt) { return dt == DType::F32 || dt == DType::F16 || dt == DType::BF16 || dt == DType::F64; }

/// All errors hanpu reports to users carry a message naming the tensor/file and what was expected.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

constexpr int kMaxRank = 5;

struct TensorView {
  void* data = nullptr;
  DType dtype = DType::F32;
  int rank = 0;
  std::array<int64_t, kMaxRank> shape{};
  std::array<int64_t, kMaxRank> stride{};  // in elements

  bool empty() const { return data == nullptr; }
  int64_t size(int d) const { return shape[d]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= shape[i];
    return n;
  }
  bool is_contiguous() const;
  std::string shape_str() const;  // "[2,64,4,128]"

  /// A contiguous row-major view of `data` with the given shape.
  static TensorView contiguous(void* data, DType dtype, std::initializer_list<int64_t> shape);
  static TensorView contiguous(void* data, DType dtype, const std::vector<int64_t>& shape);
};

/// Owned zero-initialised bytes, 64-byte aligned. Buffers of 2 MiB and more are 2 MiB aligned and
/// ask the kernel for transparent huge pages: LA kernels read one row per head per token, a page
/// apart, and with 4 KiB pages every row costs a TLB miss.
class ByteBuffer {
 public:
  ByteBuffer() = default;
  explicit ByteBuffer(size_t bytes);
  ByteBuffer(const ByteBuffer& other);
  ByteBuffer& operator=(const ByteBuffer& other);
  ByteBuffer(ByteBuffer&& other) noexcept;
  ByteBuffer& operator=(ByteBuffer&& other) noexcept;
  ~ByteBuffer();
  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

/// An owned, contiguous, zero-initialised tensor.
class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape);
  DType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  int64_t numel() const;
  void* data() { return storage_.data(); }
  const void* data() const { return storage_.data(); }
  size_t bytes() const { return storage_.size(); }
  TensorView view() const;  // the view is mutable: Tensor owns plain bytes
  template <class T>
  T* ptr() { return reinterpret_cast<T*>(storage_.data()); }
  template <class T>
  const T* ptr() const { return reinterpret_cast<const T*>(storage_.data()); }
  bool defined() const { return !shape_.empty() || !storage_.empty(); }

  /// Element access converting to/from double (for tests, references and small tools).
  double get(int64_t flat_index) const;
  void set(int64_t flat_index, double value);

 private:
  DType dtype_ = DType::F32;
  std::vector<int64_t> shape_;
  ByteBuffer storage_;
};

// --- scalar conversions (round-to-nearest-even) -----------------------------------------------
float bf16_to_f32(uint16_t h);
uint16_t f32_to_bf16(float f);
float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

/// Reads element `i` of a contiguous buffer of dtype `dt` as double.
double load_as_double(const void* base, DType dt, int64_t i);
/// Writes `v` (rounded to `dt`) into element `i` of a contiguous buffer.
void store_from_double(void* base, DType dt, int64_t i, double v);

}  // namespace hanpu
