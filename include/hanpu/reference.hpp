// The fp64 token-by-token references of GDN and KDA (FLA's naive_recurrent_gated_delta_rule and naive_recurrent_kda): the oracle every
// fast path is tested against. Inputs are read at their stored precision and computed in double.
#pragma once

#include "hanpu/la.hpp"

namespace hanpu {

struct LaReference {
  Tensor o;            // [B,T,HV,V] F64
  Tensor final_state;  // [N,HV,K,V] F64
};

/// Runs the exact recurrence (decay first, then the delta-rule error; output from the updated
/// state; scale on q; value head hv reads key head hv / (HV/H)), honouring every LaOptions flag.
LaReference la_reference(Variant variant, const LaInputs& in, const LaOptions& opt);

}  // namespace hanpu
