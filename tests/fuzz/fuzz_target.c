/* libFuzzer entry point: each input is one operation sequence, run on a
 * fresh registry and checked against the model (driver.h). Built only with
 * -Dfuzz=true; scripts/fuzz.sh builds and runs it. */
#include "driver.h"

#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	adg_fuzz_run(data, size, NULL);
	return 0;
}
