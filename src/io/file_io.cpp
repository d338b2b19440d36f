#include "io/file_io.hpp"

#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "hanpu/tensor.hpp"

namespace hanpu {

namespace {

std::string kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

std::string errno_text(int err) { return std::strerror(err); }

// The process umask, read without changing it (umask(2) can only be read by setting it, which is
// not thread-safe); Linux reports it in /proc/self/status (proc(5), "Umask").
mode_t current_umask() {
  std::ifstream st("/proc/self/status");
  std::string line;
  while (std::getline(st, line))
    if (line.rfind("Umask:", 0) == 0) return static_cast<mode_t>(std::strtoul(line.c_str() + 6, nullptr, 8));
  return 022;
}

}  // namespace

int open_regular_file(const std::string& path, const std::string& what, uint64_t* size) {
  // O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer (fifo(7)).
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int err = errno;
    throw Error(path + ": cannot open " + what + ": " + errno_text(err));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw Error(path + ": cannot stat " + what + ": " + errno_text(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": " + what + " is " + kind_of(st.st_mode) + ", expected a regular file");
  }
  // Regular files never block; clear O_NONBLOCK anyway so later reads behave normally.
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (size) *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

std::string read_regular_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  uint64_t size = 0;
  const int fd = open_regular_file(path, what, &size);
  if (size > max_bytes) {
    ::close(fd);
    throw Error(path + ": " + what + " is " + std::to_string(size) + " bytes, expected at most " +
                std::to_string(max_bytes));
  }
  std::string out(static_cast<size_t>(size), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t n = ::read(fd, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw Error(path + ": cannot read " + what + ": " + errno_text(err));
    }
    if (n == 0) break;  // shrank while reading
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  out.resize(done);
  return out;
}

AtomicFile::AtomicFile(const std::string& path) : path_(path), target_(path) {
  namespace fs = std::filesystem;
  if (path.empty()) throw Error("output file name is empty");
  struct stat st {};
  mode_t mode = 0666 & ~current_umask();
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      // Follow the link: replace the file it points to, keep the link (a dangling link is refused:
      // creating its target through a rename would be a surprise).
      char resolved[PATH_MAX];
      if (!::realpath(path.c_str(), resolved))
        throw Error(path + ": the output is a symlink whose target cannot be resolved (" + errno_text(errno) +
                    "), expected a regular file or a symlink to one");
      target_ = resolved;
      if (::stat(target_.c_str(), &st) != 0) throw Error(path + ": cannot stat the output: " + errno_text(errno));
    }
    if (!S_ISREG(st.st_mode))
      throw Error(path + ": the output exists and is " + kind_of(st.st_mode) + ", expected a regular file");
    mode = st.st_mode & 07777;
  }
  fs::path dir = fs::path(target_).parent_path();
  if (dir.empty()) dir = ".";
  std::string tmpl = (dir / ("." + fs::path(target_).filename().string() + ".tmp.XXXXXX")).string();
  fd_ = ::mkostemp(tmpl.data(), O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    throw Error(path + ": cannot open for writing: cannot create a temporary file in " + dir.string() + ": " +
                errno_text(err));
  }
  temp_ = tmpl;
  ::fchmod(fd_, mode);  // mkstemp creates 0600; give the file the mode it would have had
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && !temp_.empty()) ::unlink(temp_.c_str());
}

void AtomicFile::fail(const std::string& what, int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
  throw Error(path_ + ": " + what + ": " + errno_text(err) + " (the previous content is untouched)");
}

void AtomicFile::write(const void* data, size_t bytes) {
  if (fd_ < 0) throw Error(path_ + ": write after the output was closed");
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail("write failed", errno);
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  if (fd_ < 0) throw Error(path_ + ": commit after the output was closed");
  if (::fsync(fd_) != 0) fail("fsync failed", errno);
  if (::close(fd_) != 0) {
    fd_ = -1;
    fail("close failed", errno);
  }
  fd_ = -1;
  if (::rename(temp_.c_str(), target_.c_str()) != 0) fail("cannot rename the temporary file over the output", errno);
  committed_ = true;
  // Make the rename durable: fsync the directory (best effort; some file systems refuse).
  std::string dir = std::filesystem::path(target_).parent_path().string();
  if (dir.empty()) dir = ".";
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

void write_file_atomic(const std::string& path, std::string_view text) {
  AtomicFile f(path);
  f.write(text);
  f.commit();
}

}  // namespace hanpu
