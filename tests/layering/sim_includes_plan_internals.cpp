// Must NOT compile with the simulator's include view: it works from a Plan and a Device (public
// headers), not the planner's internals such as plan/lower.hpp.
#include "plan/lower.hpp"
