/* Error names and messages, and the version string. */
#include "internal.h"

const char *adg_version(void)
{
	return ADG_VERSION_STRING; /* meson's project version */
}

/* Both from ADG_ERROR_MAP (adg.h): one case per code. */
const char *adg_strerror(int code)
{
	switch (code) {
#define MESSAGE(name, value, message)                                          \
	case value:                                                            \
		return message;
		ADG_ERROR_MAP(MESSAGE)
#undef MESSAGE
	default:
		return "unknown error";
	}
}

const char *adg_error_name(int code)
{
	switch (code) {
#define NAME(name, value, message)                                             \
	case value:                                                            \
		return "ADG_" #name;
		ADG_ERROR_MAP(NAME)
#undef NAME
	default:
		return "ADG_UNKNOWN";
	}
}
