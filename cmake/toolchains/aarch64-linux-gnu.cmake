# Cross-compiling hanpu for ARM64 Linux with Debian's aarch64 toolchain (g++-aarch64-linux-gnu)
# against Debian's multiarch arm64 packages (libhwy-dev:arm64, libgtest-dev:arm64, ...), which live
# under the host's own root (/usr/lib/aarch64-linux-gnu, /usr/include). scripts/test_arm64.sh
# installs both and runs the tests under qemu-user.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
# pkg-config (PCRE2, utf8proc) must report the arm64 .pc files, not the host's.
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Programs the build runs (GoogleTest discovery, CTest) go through qemu-user. Its library prefix is
# "/" so the dynamic loader and libc are the multiarch libc6:arm64 pair: pointing it at the cross
# toolchain's sysroot (/usr/aarch64-linux-gnu) instead mixes that ld.so with the multiarch libc.so.6
# of another Debian revision, and pthread_create then loops forever in the stack cache.
set(CMAKE_CROSSCOMPILING_EMULATOR qemu-aarch64 -L /)
