/* Every internal header of libbfshard, for the tests, the fuzzers (fuzz/), the benches and
 * the dev tools, which reach inside the library on purpose. src/ never includes this: each
 * file there includes the headers of the folders it may use (dev/layers/order). */
#ifndef BFS_TESTS_INTERNAL_H
#define BFS_TESTS_INTERNAL_H

#include "base/base.h"
#include "base/json_scan.h"
#include "input/input.h"
#include "formats/tensor.h"
#include "plan/plan.h"
#include "backend/backend.h"
#include "zst/zst.h"
#include "commands/commands.h"

#endif
