// The struct and the field type of a pointer to a data member, for code generated per field (the
// setting tables and their C bindings): OwnerOf<&S::f> is S, FieldOf<&S::f> is f's type.
#pragma once

namespace specrun {

template <typename Member>
struct MemberOf;
template <typename Owner_, typename Field_>
struct MemberOf<Field_ Owner_::*> {
  using Owner = Owner_;
  using Field = Field_;
};

template <auto Member>
using OwnerOf = typename MemberOf<decltype(Member)>::Owner;
template <auto Member>
using FieldOf = typename MemberOf<decltype(Member)>::Field;

}  // namespace specrun
