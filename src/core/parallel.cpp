#include "core/parallel.h"

#include <omp.h>

namespace dsv4 {

int n_threads() { return omp_get_max_threads(); }

}  // namespace dsv4
