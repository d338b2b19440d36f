// Must NOT compile with the model's include view: the model sees no header of src/cpu
// (CMakeLists.txt, hanpu_model), not the linear layers' internal kernels.
#include "cpu/linear_kernels.hpp"
