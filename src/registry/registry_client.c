/*-------------------------------------------------------------------------
 *
 * registry/registry_client.c
 *		The schema registry's Confluent-compatible REST API, through libcurl:
 *		the latest schema of a subject (GET /subjects/<subject>/versions/latest).
 *
 * Invariants:
 *	- This file is the only one that includes libcurl's header.
 *	- A call is bounded: outbox.schema_registry_timeout for the whole
 *	  exchange, and shutdown (SIGTERM) aborts it at once, so the relay's
 *	  shutdown bound holds while a registry does not answer.
 *	- The answer is hostile input: at most REGISTRY_ANSWER_MAX bytes, parsed
 *	  as JSON with the error caught; its text never reaches a message
 *	  beyond the HTTP status and the registry's error code.
 *	- The credentials (user:password, from the secrets file's
 *	  schema.registry.basic.auth.user.info) are never in a message: a
 *	  failure names the URL without them, and the URL may not hold any.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <errno.h>

#include <curl/curl.h>

#include "miscadmin.h"
#include "postmaster/interrupt.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"

#include "registry/registry.h"

#define REGISTRY_ANSWER_MAX (4 * 1024 * 1024)
#define REGISTRY_CONNECT_MS 2000

/* user:password as last read from the secrets file (malloc'd), or NULL */
static char *registry_auth = NULL;
static bool curl_ready = false;

/*
 * OutboxRegistryReadSecrets
 *		The registry's credentials as the secrets file gives them (NULL:
 *		none); kept until the next read.
 */
void
OutboxRegistryReadSecrets(const char *userinfo)
{
	if (registry_auth != NULL)
	{
		explicit_bzero(registry_auth, strlen(registry_auth));
		free(registry_auth);
	}
	registry_auth = userinfo ? strdup(userinfo) : NULL;
}

/*
 * OutboxRegistryUrlIsValid
 *		outbox.schema_registry_url's check: empty, or an http or https URL
 *		with no credentials in it.
 */
bool
OutboxRegistryUrlIsValid(const char *url, const char **why)
{
	const char *rest;
	size_t		authority;

	if (url == NULL || url[0] == '\0')
		return true;
	if (pg_strncasecmp(url, "http://", 7) == 0)
		rest = url + 7;
	else if (pg_strncasecmp(url, "https://", 8) == 0)
		rest = url + 8;
	else
	{
		*why = "The URL must begin with http:// or https://.";
		return false;
	}
	authority = strcspn(rest, "/?#");
	if (authority == 0)
	{
		*why = "The URL names no host.";
		return false;
	}
	if (memchr(rest, '@', authority) != NULL)
	{
		*why = "Credentials go in outbox.kafka_secrets_file (schema.registry.basic.auth.user.info), not in the URL.";
		return false;
	}
	if (strpbrk(url, " \t\r\n\"'\\") != NULL)
	{
		*why = "The URL contains a space, a quote or a backslash.";
		return false;
	}
	return true;
}

static size_t
collect(char *data, size_t size, size_t n, void *arg)
{
	StringInfo	buf = (StringInfo) arg;
	size_t		len = size * n;

	if (buf->len + len > REGISTRY_ANSWER_MAX)
		return 0;				/* ends the transfer: CURLE_WRITE_ERROR */
	appendBinaryStringInfo(buf, data, (int) len);
	return len;
}

/* libcurl asks this often: a nonzero answer aborts the transfer */
static int
progress(void *arg, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow)
{
	return ShutdownRequestPending || ProcDiePending ? 1 : 0;
}

/* a number as a positive int32, or 0: never raises */
static int32
positive_int32(const JsonbValue *v)
{
	char	   *text = DatumGetCString(DirectFunctionCall1(numeric_out,
														  NumericGetDatum(v->val.numeric)));
	char	   *end;
	long		n;

	errno = 0;
	n = strtol(text, &end, 10);
	return (errno == 0 && *end == '\0' && n > 0 && n <= PG_INT32_MAX) ? (int32) n : 0;
}

/* the value of key in a JSON object, or NULL */
static JsonbValue *
member(Jsonb *jb, const char *key)
{
	JsonbValue	k;

	k.type = jbvString;
	k.val.string.val = (char *) key;
	k.val.string.len = strlen(key);
	return findJsonbValueFromContainer(&jb->root, JB_FOBJECT, &k);
}

/*
 * parse_answer
 *		The registry's answer to versions/latest: its id and its schema's
 *		text, an Avro one (SCHEMA); a schema of another type is REFUSED, an
 *		answer not of that form NO_ANSWER, with err set.  jsonb_in's error
 *		on a body that is not JSON is caught here.
 */
static OutboxRegistryAnswer
parse_answer(StringInfo body, const char *subject, int32 *id, char **schema,
			 char *err, size_t errlen)
{
	MemoryContext cxt = CurrentMemoryContext;
	Jsonb	   *jb = NULL;
	JsonbValue *v;

	PG_TRY();
	{
		jb = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum(body->data)));
	}
	PG_CATCH();
	{
		MemoryContextSwitchTo(cxt);
		FlushErrorState();
		jb = NULL;
	}
	PG_END_TRY();
	if (jb == NULL || !JB_ROOT_IS_OBJECT(jb))
	{
		snprintf(err, errlen, "the schema registry's answer for subject \"%s\" is not a JSON object", subject);
		return OUTBOX_REGISTRY_NO_ANSWER;
	}
	v = member(jb, "schemaType");
	if (v != NULL && !(v->type == jbvString && v->val.string.len == 4 &&
					   strncmp(v->val.string.val, "AVRO", 4) == 0))
	{
		snprintf(err, errlen, "the latest schema of subject \"%s\" is not an Avro schema", subject);
		return OUTBOX_REGISTRY_REFUSED;
	}
	v = member(jb, "id");
	if (v == NULL || v->type != jbvNumeric || (*id = positive_int32(v)) == 0)
	{
		snprintf(err, errlen, "the schema registry's answer for subject \"%s\" has no valid id", subject);
		return OUTBOX_REGISTRY_NO_ANSWER;
	}
	v = member(jb, "schema");
	if (v == NULL || v->type != jbvString)
	{
		snprintf(err, errlen, "the schema registry's answer for subject \"%s\" has no schema", subject);
		return OUTBOX_REGISTRY_NO_ANSWER;
	}
	*schema = pnstrdup(v->val.string.val, v->val.string.len);
	return OUTBOX_REGISTRY_SCHEMA;
}

/* the subject's versions/latest address under outbox.schema_registry_url */
static char *
latest_url(CURL *curl, const char *subject)
{
	char	   *escaped = curl_easy_escape(curl, subject, 0);
	size_t		base = strlen(outbox_schema_registry_url);
	char	   *url;

	while (base > 0 && outbox_schema_registry_url[base - 1] == '/')
		base--;
	url = psprintf("%.*s/subjects/%s/versions/latest", (int) base,
				   outbox_schema_registry_url, escaped ? escaped : "");
	curl_free(escaped);
	return url;
}

/*
 * verdict
 *		What the exchange with the registry says: a 404 or a schema of
 *		another type rules the subject out; no answer, another error status
 *		or a refused login are for now only.
 */
static OutboxRegistryAnswer
verdict(CURLcode rc, long status, StringInfo body, const char *subject,
		int32 *id, char **schema, char *err, size_t errlen)
{
	if (rc == CURLE_WRITE_ERROR)
		snprintf(err, errlen, "the schema registry's answer for subject \"%s\" is larger than %d MB",
				 subject, REGISTRY_ANSWER_MAX / (1024 * 1024));
	else if (rc != CURLE_OK)
		snprintf(err, errlen, "the schema registry did not answer for subject \"%s\": %s",
				 subject, curl_easy_strerror(rc));
	else if (status == 404)
	{
		snprintf(err, errlen, "subject \"%s\" is not in the schema registry (HTTP 404)", subject);
		return OUTBOX_REGISTRY_REFUSED;
	}
	else if (status == 401 || status == 403)
		snprintf(err, errlen, "the schema registry refused outbox's credentials for subject \"%s\" (HTTP %ld)",
				 subject, status);
	else if (status != 200)
		snprintf(err, errlen, "the schema registry answered HTTP %ld for subject \"%s\"",
				 status, subject);
	else
		return parse_answer(body, subject, id, schema, err, errlen);
	return OUTBOX_REGISTRY_NO_ANSWER;
}

/*
 * OutboxRegistryFetchLatest
 *		The latest schema of subject: SCHEMA with its id and text
 *		(palloc'd); otherwise err says why (verdict).  Not set, or asked
 *		while shutting down, is NO_ANSWER.
 */
OutboxRegistryAnswer
OutboxRegistryFetchLatest(const char *subject, int32 *id, char **schema,
						  char *err, size_t errlen)
{
	CURL	   *curl;
	CURLcode	rc;
	struct curl_slist *headers = NULL;
	StringInfoData body;
	long		status = 0;
	OutboxRegistryAnswer answer;

	if (outbox_schema_registry_url[0] == '\0' || ShutdownRequestPending || ProcDiePending)
	{
		snprintf(err, errlen, outbox_schema_registry_url[0] == '\0' ?
				 "outbox.schema_registry_url is not set" : "shutting down");
		return OUTBOX_REGISTRY_NO_ANSWER;
	}
	if (!curl_ready && curl_global_init(CURL_GLOBAL_DEFAULT) == CURLE_OK)
		curl_ready = true;
	if (!curl_ready || (curl = curl_easy_init()) == NULL)
	{
		snprintf(err, errlen, "libcurl could not be initialized");
		return OUTBOX_REGISTRY_NO_ANSWER;
	}
	initStringInfo(&body);
	headers = curl_slist_append(headers, "Accept: application/vnd.schemaregistry.v1+json, application/json");
	curl_easy_setopt(curl, CURLOPT_URL, latest_url(curl, subject));
	curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
	curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS, (long) outbox_schema_registry_timeout);
	curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
					 (long) Min(outbox_schema_registry_timeout, REGISTRY_CONNECT_MS));
	curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
	curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, progress);
	curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, collect);
	curl_easy_setopt(curl, CURLOPT_WRITEDATA, &body);
	curl_easy_setopt(curl, CURLOPT_USERAGENT, "outbox-relay");
	if (registry_auth != NULL)
	{
		curl_easy_setopt(curl, CURLOPT_HTTPAUTH, (long) CURLAUTH_BASIC);
		curl_easy_setopt(curl, CURLOPT_USERPWD, registry_auth);
	}
	rc = curl_easy_perform(curl);
	if (rc == CURLE_OK)
		curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
	curl_easy_cleanup(curl);
	curl_slist_free_all(headers);
	answer = verdict(rc, status, &body, subject, id, schema, err, errlen);
	pfree(body.data);
	return answer;
}
