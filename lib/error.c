/* Error names and messages, the version string, and the threads'
 * reasons (adg_errmsg). */
#include "util.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* One thread's reason: its count and code, read on success paths too
 * (adg_errmsg_serial, once per backward a thread joins), initial-exec,
 * one load from the thread pointer; and its text, written and read on
 * error paths only, in the default TLS model, so that the static TLS
 * block a dlopen'd libadg would need stays a few words. Zero at a
 * thread's start: text "" before its first failure. */
struct errmsg {
	uint64_t serial; /* reasons written on this thread */
	int code;	 /* the last reason's */
};

static __thread struct errmsg errmsg_now
	__attribute__((tls_model("initial-exec")));
static __thread char errmsg_text[ADG_ERRMSG_MAX];

const char *adg_errmsg(void)
{
	return errmsg_text;
}

uint64_t adg_errmsg_serial(void)
{
	return errmsg_now.serial;
}

int adg_errmsg_fresh(int code, uint64_t since)
{
	return errmsg_now.serial != since && errmsg_now.code == code;
}

const char *adg_code_text(int code, char buf[static 32])
{
	if (code < 0 && code > ADG_EUSER &&
	    strcmp(adg_error_name(code), "ADG_UNKNOWN") != 0)
		snprintf(buf, 32, "%s (%d)", adg_error_name(code), code);
	else
		snprintf(buf, 32, "%d", code);
	return buf;
}

/* Cuts text, len bytes that filled their buffer, before a UTF-8
 * character the cut left incomplete. */
static void errmsg_cut(char *text, size_t len)
{
	size_t lead = len;
	while (lead > 0 && ((unsigned char)text[lead - 1] & 0xc0) == 0x80)
		lead--;
	if (lead == 0 || ((unsigned char)text[lead - 1] & 0x80) == 0)
		return; /* ends in ASCII, or no lead byte to judge by */
	unsigned char c = (unsigned char)text[lead - 1];
	size_t want = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
	if (len - (lead - 1) < want)
		text[lead - 1] = '\0';
}

void adg_errmsg_clip(char *text, size_t size)
{
	size_t len = strlen(text);
	if (size > 0 && len == size - 1)
		errmsg_cut(text, len);
}

/* Writes "func: <fmt>" and, when inner is not NULL, ": <inner>" after it
 * as the thread's reason. Formatted aside first: the arguments and inner
 * may point into the reason itself. */
__attribute__((format(printf, 4, 0))) static void
errmsg_write(int code, const char *func, const char *inner, const char *fmt,
	     va_list ap)
{
	char text[ADG_ERRMSG_MAX];
	int n = snprintf(text, sizeof text, "%s: ", func);
	size_t len = n < 0 ? 0 : (size_t)n;
	if (len < sizeof text) {
		n = vsnprintf(text + len, sizeof text - len, fmt, ap);
		len += n < 0 ? 0 : (size_t)n;
	}
	if (inner != NULL && len < sizeof text) {
		n = snprintf(text + len, sizeof text - len, ": %s", inner);
		len += n < 0 ? 0 : (size_t)n;
	}
	if (len >= sizeof text) {
		len = sizeof text - 1;
		errmsg_cut(text, len);
	}
	memcpy(errmsg_text, text, sizeof text);
	errmsg_now.code = code;
	errmsg_now.serial++;
}

int adg_fail(int code, const char *func, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	errmsg_write(code, func, NULL, fmt, ap);
	va_end(ap);
	return code;
}

int adg_fail_over(int code, const char *func, uint64_t since, const char *fmt,
		  ...)
{
	va_list ap;
	va_start(ap, fmt);
	errmsg_write(code, func,
		     adg_errmsg_fresh(code, since) ? errmsg_text : NULL, fmt,
		     ap);
	va_end(ap);
	return code;
}

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
