// Must NOT compile with the model's include view: GGUF's types and (de)quantizers are public
// (hanpu/gguf_format.hpp); the block layouts the kernels read are not (CMakeLists.txt, hanpu_model).
#include "cpu/gguf_blocks.hpp"
