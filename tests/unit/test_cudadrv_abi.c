/*
 * test_cudadrv_abi.c - the CUDA driver table's entries keep the signatures of the ABI colld asks
 * the driver for (CUDA 12.0), whatever variant the compiling cuda.h maps a name to (issue 15 A2).
 *
 * The check is made by the compiler: this file pretends to be built against a future cuda.h that
 * maps cuStreamGetCtx to its newer variant (cuStreamGetCtx_v2, three parameters) and
 * cuMemHostRegister to its older one. With table entries typed after the header's mapping
 * (`__typeof__(&name)`, as before A2 was fixed) the assertions below fail to compile; with the
 * explicit types of common/cudadrv_pfn.inc they hold. At run time it only says so.
 */
#include <cuda.h>

#undef cuStreamGetCtx
#define cuStreamGetCtx cuStreamGetCtx_v2 /* a header whose default is the newer variant */
#undef cuMemHostRegister
#define cuMemHostRegister cuMemHostRegister_v1 /* ... or an older one */

#include "common/cudadrv.h"

#include <stdio.h>

#define SAME_TYPE(member, pfn) __builtin_types_compatible_p(__typeof__(((colld_cu_t *)0)->member), pfn)

_Static_assert(SAME_TYPE(cuStreamGetCtx, PFN_cuStreamGetCtx_v9020),
               "cuStreamGetCtx must keep its CUDA 12.0 signature whatever cuda.h maps the name to");
_Static_assert(SAME_TYPE(cuMemHostRegister, PFN_cuMemHostRegister_v6050),
               "cuMemHostRegister must keep its CUDA 12.0 signature whatever cuda.h maps the name to");
_Static_assert(SAME_TYPE(cuLaunchKernel, PFN_cuLaunchKernel_v4000), "cuLaunchKernel: the 12.0 variant");
_Static_assert(SAME_TYPE(cuStreamWaitValue32, PFN_cuStreamWaitValue32_v11070), "cuStreamWaitValue32: the 12.0 variant");

int main(void)
{
    printf("the driver table's types are the CUDA %d.%d ABI's, whatever cuda.h maps the names to\n",
           COLLD_CU_ABI / 1000, COLLD_CU_ABI % 1000 / 10);
    return 0;
}
