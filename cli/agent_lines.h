// An agent's statistics as lines for people: the one formatter is protocol's
// (solar/node_summary.h), which `solar run` and srun both call; `solar stat` (cmd_stat.cpp)
// shows its pieces under these names.
#pragma once

#include "solar/node_summary.h"

namespace solar::cli {

using protocol::device_bytes;
using protocol::fell_through_line;
using protocol::peers_line;
using protocol::transparent_line;

}  // namespace solar::cli
