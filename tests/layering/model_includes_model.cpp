// The control of the model's layering checks: the model's own headers, with the engine's public
// interface and the three src/cpu headers they use, compile with its view.
#include "model/blocks.hpp"
#include "model/layer_ops.hpp"
#include "cpu/isa.hpp"
