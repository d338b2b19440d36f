// The control of the layering checks: the planner's own headers compile with its view, so the
// failures above come from the views, not from the flags.
#include "plan/lower.hpp"
