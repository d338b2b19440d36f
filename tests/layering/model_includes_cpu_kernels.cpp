// Must NOT compile with the model's include view: of src/cpu the model sees three headers
// (CMakeLists.txt, hanpu_model), not the linear layers' internal kernels.
#include "cpu/linear_kernels.hpp"
