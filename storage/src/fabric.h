// The fabric endpoint's public header, under the name storage's own tests include it by
// (tests/storage/server_test.cpp): solar/storage/fabric.h.
#pragma once

#include "solar/storage/fabric.h"
