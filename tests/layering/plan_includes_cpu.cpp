// Must NOT compile with the planner's include view: src/plan may not include the CPU backend
// (tests/CMakeLists.txt, Layering.PlanCannotIncludeTheCpuBackend).
#include "cpu/thread_pool.hpp"
