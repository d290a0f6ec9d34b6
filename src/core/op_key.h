// SPDX-License-Identifier: Apache-2.0
// (process set, name), the key an op is known by on every rank, for hash maps that are looked
// up once per op: lookups take a string_view, so none builds a key string.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>

namespace tutti::core {

// A key that owns its name.
struct OpKey {
  int process_set_id = 0;
  std::string name;
};

// A key that borrows its name: valid while the string it views is alive and unchanged.
struct OpKeyView {
  int process_set_id = 0;
  std::string_view name;
};

inline OpKeyView view_of(const OpKey& key) { return {key.process_set_id, key.name}; }

// Hash and equality for OpKey and OpKeyView alike (heterogeneous lookup).
struct OpKeyHash {
  using is_transparent = void;
  std::size_t operator()(OpKeyView key) const {
    // Sets are few and small numbers: mixing the id into the name's hash is enough.
    return std::hash<std::string_view>()(key.name) ^
           (static_cast<std::size_t>(key.process_set_id) * 0x9e3779b97f4a7c15ULL);
  }
  std::size_t operator()(const OpKey& key) const { return (*this)(view_of(key)); }
};

struct OpKeyEqual {
  using is_transparent = void;
  bool operator()(OpKeyView a, OpKeyView b) const {
    return a.process_set_id == b.process_set_id && a.name == b.name;
  }
  bool operator()(const OpKey& a, OpKeyView b) const { return (*this)(view_of(a), b); }
  bool operator()(OpKeyView a, const OpKey& b) const { return (*this)(a, view_of(b)); }
  bool operator()(const OpKey& a, const OpKey& b) const { return (*this)(view_of(a), view_of(b)); }
};

}  // namespace tutti::core
