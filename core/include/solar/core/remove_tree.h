// Transitional: remove_tree moved to sys/ (solar/sys/remove_tree.h). This header goes once its
// last includers outside core include that one.
#pragma once

#include "solar/sys/remove_tree.h"

namespace solar {
using sys::remove_tree;
}  // namespace solar
