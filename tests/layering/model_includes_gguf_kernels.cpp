// Must NOT compile with the model's include view: GGUF projections reach the model as GgufLinear
// (hanpu/linear.hpp), not through the GEMV's activation quantizer and kernels (CMakeLists.txt,
// hanpu_model).
#include "cpu/linear_gguf.hpp"
