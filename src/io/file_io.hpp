// Reading input files and writing output files safely.
//
// Reading: open with O_NONBLOCK and fstat before reading, so a FIFO, a device or a directory given
// as an input is an error naming the file instead of a hang or "basic_filebuf::underflow".
//
// Writing: every output hanpu writes (plan -o, report -o, simulate --timeline, safetensors) goes
// through AtomicFile: a unique temporary file (mkstemp) in the target's directory, written,
// fsync'ed and renamed over the target, then the directory fsync'ed (the pattern of POSIX
// rename(2): readers see the old or the new content, never a truncated mix). A symlink target is
// followed (the file it points to is replaced, the link stays); a target that exists and is not a
// regular file (FIFO, directory, device) is refused.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace hanpu {

/// Reads the whole regular file at `path`; `what` names it in errors ("config", "plan file", ...).
/// Throws hanpu::Error naming the file if it is missing, not a regular file, unreadable or larger
/// than `max_bytes`.
std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes);

/// Opens `path` read-only after checking it is a regular file (no blocking on FIFOs); returns the
/// descriptor (the caller closes it) and its size. Throws hanpu::Error naming the file.
int open_regular_file(const std::string& path, const std::string& what, uint64_t* size);

/// An output file written atomically. Destroying it without commit() removes the temporary file
/// and leaves the target untouched.
class AtomicFile {
 public:
  explicit AtomicFile(const std::string& path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, size_t bytes);
  void write(std::string_view s) { write(s.data(), s.size()); }
  /// fsync, rename over the target, fsync the directory. Throws hanpu::Error naming the target.
  void commit();
  /// The file that commit() replaces (the symlink's target when the path is a symlink).
  const std::string& target() const { return target_; }
  const std::string& temp_path() const { return temp_; }

 private:
  [[noreturn]] void fail(const std::string& what, int err);
  std::string path_, target_, temp_;
  int fd_ = -1;
  bool committed_ = false;
};

/// Writes `text` to `path` atomically (AtomicFile).
void write_file_atomic(const std::string& path, std::string_view text);

}  // namespace hanpu
