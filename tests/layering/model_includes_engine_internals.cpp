// Must NOT compile with the model's include view: src/model uses the engine through its public
// headers (hanpu/engine.hpp, hanpu/engine_work.hpp), not its pool and plan cache.
#include "cpu/engine_impl.hpp"
