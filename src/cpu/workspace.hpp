// The buffers one part of an engine's run reuses across calls: public since the model uses them
// (hanpu/engine_work.hpp); here under the names src/cpu has always used.
#pragma once

#include "hanpu/engine_work.hpp"

namespace hanpu::cpu {

using hanpu::Workspace;
using hanpu::WorkspaceSlot;
using enum hanpu::WorkspaceSlot;

}  // namespace hanpu::cpu
