// `hanpu_isa_query [--choices]`: prints what `hanpu isa` prints (hanpu::describe_isa), linked
// against the CPU backend alone. scripts/test_arm64.sh asks it which target each HANPU_ISA value
// selects, so that the ARM64 cross build compiles only the engine and the three LA test programs,
// not the model library and the CLI (about 60% of that build's compile time).
#include <cstring>
#include <exception>
#include <iostream>

#include "hanpu/isa.hpp"

int main(int argc, char** argv) {
  const bool choices_only = argc == 2 && std::strcmp(argv[1], "--choices") == 0;
  if (argc > 2 || (argc == 2 && !choices_only)) {
    std::cerr << "usage: hanpu_isa_query [--choices]\n";
    return 2;
  }
  try {
    std::cout << hanpu::describe_isa(choices_only);
  } catch (const std::exception& e) {
    std::cerr << "hanpu_isa_query: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
