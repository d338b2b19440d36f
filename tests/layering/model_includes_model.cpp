// The control of the model's layering checks: the model's own headers, with the engine's public
// interface (include/hanpu) they use, compile with its view.
#include "model/blocks.hpp"
#include "model/layer_ops.hpp"
#include "hanpu/isa.hpp"
#include "hanpu/linear.hpp"
#include "model/model_parts.hpp"
