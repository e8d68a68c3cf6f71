/*-------------------------------------------------------------------------
 *
 * registry/registry_avro.c
 *		An event's jsonb payload encoded as Avro with a registered schema,
 *		framed in the registries' wire format (the magic byte 0, the schema
 *		id in 4 bytes big-endian, the record), through avro-c.
 *
 * Invariants:
 *	- This file is the only one that includes avro-c's headers.
 *	- The payload is hostile: whatever does not fit the schema is refused
 *	  with a sentence that names the field by its path in the schema's own
 *	  names ($.items[2].sku; a map's key is [(a key)]) and the schema's id,
 *	  never by quoting a value or a key of the payload.  The walk is
 *	  bounded in depth and in the values it makes, and a schema whose
 *	  record contains itself other than through a union, an array or a map
 *	  is refused before avro-c would recurse making a value of it.
 *	- avro-c's calls return codes; what it holds stays valid whatever
 *	  happens (the value is reset before each use), so the few calls that
 *	  may raise (a conversion to UTF-8, palloc) leave nothing behind; the
 *	  relay catches them (relay_avro.c).  avro-c's messages can quote the
 *	  schema: they go out as printable ASCII only, shortened.
 *	- The mapping is Avro's JSON encoding, with two conveniences: a union
 *	  takes a plain value (the first branch of its kind: null, boolean,
 *	  number, string, array, object) as well as the tagged {"type": value},
 *	  and a record field left out is null when its type is a union with
 *	  null.  A field the schema does not have is refused, so nothing
 *	  emitted is dropped silently.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include <errno.h>
#include <float.h>
#include <math.h>

#include <avro.h>

#include "mb/pg_wchar.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/memutils.h"
#include "utils/numeric.h"

#include "registry/registry.h"

struct OutboxAvroSchema
{
	int32		id;
	avro_schema_t schema;
	avro_value_iface_t *iface;
	avro_value_t value;			/* reused from event to event */
};

/*
 * Bounds of one payload's walk: how deep it nests (the walk recurses, and
 * a recursive schema lets the payload choose the depth), and how many
 * values avro-c makes for it (a short JSON element can stand for a record
 * of many fields).  Past them the payload is refused, never an ERROR.
 */
#define AVRO_WALK_MAX_DEPTH		100
#define AVRO_WALK_MAX_VALUES	1000000
/* a value that grew past this is made anew: avro-c keeps arrays' room */
#define AVRO_VALUE_RENEW_BYTES	(1024 * 1024)

/* where the walk is, for the refusal's sentence */
typedef struct AvroWalk
{
	StringInfoData path;
	char	   *err;
	size_t		errlen;
	int32		id;
	int			depth;
	long		values;
} AvroWalk;

static bool put_value(AvroWalk *w, avro_value_t *dest, const JsonbValue *jv);
static bool put_typed(AvroWalk *w, avro_value_t *dest, avro_schema_t s,
					  const JsonbValue *jv);

/* the kind of a JSON value, as the refusals name it */
static const char *
json_kind(const JsonbValue *jv)
{
	switch (jv->type)
	{
		case jbvNull:
			return "null";
		case jbvBool:
			return "a boolean";
		case jbvNumeric:
			return "a number";
		case jbvString:
			return "a string";
		case jbvBinary:
			return JsonContainerIsArray(jv->val.binary.data) ? "an array" : "an object";
		default:
			return "a JSON value";
	}
}

static avro_schema_t
resolved(avro_schema_t s)
{
	while (s != NULL && avro_typeof(s) == AVRO_LINK)
		s = avro_schema_link_target(s);
	return s;
}

static const char *
type_name(avro_schema_t s)
{
	s = resolved(s);
	return avro_typeof(s) == AVRO_INT32 ? "int" :
		avro_typeof(s) == AVRO_INT64 ? "long" : avro_schema_type_name(s);
}

/* refuse at the current path; always returns false */
static bool
refuse(AvroWalk *w, const char *fmt, const char *a, const char *b)
{
	char		what[256];

	snprintf(what, sizeof(what), fmt, a, b);
	snprintf(w->err, w->errlen, "the payload does not fit schema %d: at %s, %s",
			 w->id, w->path.data, what);
	return false;
}

/*
 * avro-c's last error, as a message may carry it: it can quote the schema
 * text, which the registry gave, so only printable ASCII of it, shortened.
 */
static const char *
avro_message(char *out, size_t n)
{
	const char *e = avro_strerror();
	size_t		i;

	for (i = 0; i + 1 < n && e[i] != '\0' && i < 160; i++)
		out[i] = (e[i] >= 0x20 && e[i] < 0x7f) ? e[i] : '?';
	out[i] = '\0';
	return out;
}

static bool
avro_failed(AvroWalk *w, int rc)
{
	char		msg[192];

	return refuse(w, "avro-c failed: %s%s",
				  rc == ENOMEM ? "out of memory" : avro_message(msg, sizeof(msg)), "");
}

/*
 * A number as an integer within [min, max]: the numeric's text is plain
 * decimal (jsonb keeps no exponent), and a fraction of zeros is integral.
 */
static bool
numeric_integer(const JsonbValue *jv, int64 min, int64 max, int64 *out)
{
	char	   *text = DatumGetCString(DirectFunctionCall1(numeric_out,
														  NumericGetDatum(jv->val.numeric)));
	char	   *dot = strchr(text, '.');
	char	   *end;
	long long	v;

	if (dot != NULL)
	{
		for (end = dot + 1; *end == '0'; end++)
			;
		if (*end != '\0')
			return false;
		*dot = '\0';
	}
	errno = 0;
	v = strtoll(text, &end, 10);
	if (errno != 0 || *end != '\0' || v < min || v > max)
		return false;
	*out = (int64) v;
	return true;
}

static bool
numeric_double(const JsonbValue *jv, double *out)
{
	char	   *text = DatumGetCString(DirectFunctionCall1(numeric_out,
														  NumericGetDatum(jv->val.numeric)));

	/* an underflow (ERANGE with a tiny result) is the nearest double */
	*out = strtod(text, NULL);
	return isfinite(*out);
}

/*
 * A JSON string's text in UTF-8, which Avro's strings are, NUL-terminated
 * (palloc'd): converted from the database's encoding when it is another.
 */
static char *
utf8_text(const char *s, int len)
{
	char	   *copy = pnstrdup(s, len);

	if (GetDatabaseEncoding() == PG_UTF8)
		return copy;
	return pg_server_to_any(copy, len, PG_UTF8);
}

/*
 * A JSON string as Avro's JSON encoding writes bytes and fixed: each code
 * point one byte, so none above U+00FF.  Returns the length, or -1.
 */
static int
string_bytes(const JsonbValue *jv, char *out)
{
	const unsigned char *s = (const unsigned char *) utf8_text(jv->val.string.val,
															   jv->val.string.len);
	int			len = strlen((const char *) s);
	int			i = 0;
	int			n = 0;

	while (i < len)
	{
		int			l = pg_utf_mblen(s + i);
		pg_wchar	c;

		if (i + l > len)
			return -1;
		c = utf8_to_unicode(s + i);
		if (c > 0xFF)
			return -1;
		out[n++] = (char) c;
		i += l;
	}
	return n;
}

static bool
put_bytes(AvroWalk *w, avro_value_t *dest, avro_schema_t s, const JsonbValue *jv)
{
	char	   *buf = palloc(jv->val.string.len * 4 + 1);
	int			n = string_bytes(jv, buf);
	int			rc;

	if (n < 0)
		return refuse(w, "expected %s, found a string with a character above U+00FF",
					  type_name(s), "");
	if (avro_typeof(s) == AVRO_FIXED)
	{
		if (n != avro_schema_fixed_size(s))
		{
			char		want[32];

			snprintf(want, sizeof(want), "%lld", (long long) avro_schema_fixed_size(s));
			return refuse(w, "expected fixed \"%s\" of %s bytes", avro_schema_name(s), want);
		}
		rc = avro_value_set_fixed(dest, buf, n);
	}
	else
		rc = avro_value_set_bytes(dest, buf, n);
	return rc == 0 ? true : avro_failed(w, rc);
}

/* a scalar JSON value into a primitive or enum type */
static bool
put_scalar(AvroWalk *w, avro_value_t *dest, avro_schema_t s, const JsonbValue *jv)
{
	avro_type_t t = avro_typeof(s);
	int			rc = 0;
	int64		i;
	double		d;

	if (t == AVRO_NULL && jv->type == jbvNull)
		rc = avro_value_set_null(dest);
	else if (t == AVRO_BOOLEAN && jv->type == jbvBool)
		rc = avro_value_set_boolean(dest, jv->val.boolean ? 1 : 0);
	else if ((t == AVRO_INT32 || t == AVRO_INT64) && jv->type == jbvNumeric)
	{
		bool		wide = (t == AVRO_INT64);

		if (!numeric_integer(jv, wide ? PG_INT64_MIN : PG_INT32_MIN,
							 wide ? PG_INT64_MAX : PG_INT32_MAX, &i))
			return refuse(w, "expected %s, found a number that is not one", type_name(s), "");
		rc = wide ? avro_value_set_long(dest, i) : avro_value_set_int(dest, (int32) i);
	}
	else if ((t == AVRO_FLOAT || t == AVRO_DOUBLE) && jv->type == jbvNumeric)
	{
		if (!numeric_double(jv, &d) || (t == AVRO_FLOAT && fabs(d) > FLT_MAX))
			return refuse(w, "expected %s, found a number out of its range", type_name(s), "");
		rc = t == AVRO_FLOAT ? avro_value_set_float(dest, (float) d) :
			avro_value_set_double(dest, d);
	}
	else if (t == AVRO_STRING && jv->type == jbvString)
	{
		char	   *str = utf8_text(jv->val.string.val, jv->val.string.len);

		rc = avro_value_set_string_len(dest, str, strlen(str) + 1);
	}
	else if ((t == AVRO_BYTES || t == AVRO_FIXED) && jv->type == jbvString)
		return put_bytes(w, dest, s, jv);
	else if (t == AVRO_ENUM && jv->type == jbvString)
	{
		char	   *sym = utf8_text(jv->val.string.val, jv->val.string.len);
		int			n = avro_schema_enum_get_by_name(s, sym);

		if (n < 0)
			return refuse(w, "the string is not a symbol of enum \"%s\"%s",
						  avro_schema_name(s), "");
		rc = avro_value_set_enum(dest, n);
	}
	else
		return refuse(w, "expected %s, found %s", type_name(s), json_kind(jv));
	return rc == 0 ? true : avro_failed(w, rc);
}

/* does the JSON value's kind match the branch's type (for a plain union value) */
static bool
kind_fits(avro_schema_t s, const JsonbValue *jv)
{
	switch (avro_typeof(s))
	{
		case AVRO_NULL:
			return jv->type == jbvNull;
		case AVRO_BOOLEAN:
			return jv->type == jbvBool;
		case AVRO_INT32:
		case AVRO_INT64:
			{
				int64		i;

				return jv->type == jbvNumeric &&
					numeric_integer(jv, avro_typeof(s) == AVRO_INT32 ? PG_INT32_MIN : PG_INT64_MIN,
									avro_typeof(s) == AVRO_INT32 ? PG_INT32_MAX : PG_INT64_MAX, &i);
			}
		case AVRO_FLOAT:
		case AVRO_DOUBLE:
			{
				double		d;

				return jv->type == jbvNumeric && numeric_double(jv, &d) &&
					(avro_typeof(s) == AVRO_DOUBLE || fabs(d) <= FLT_MAX);
			}
		case AVRO_STRING:
		case AVRO_BYTES:
		case AVRO_FIXED:
		case AVRO_ENUM:
			return jv->type == jbvString;
		case AVRO_ARRAY:
			return jv->type == jbvBinary && JsonContainerIsArray(jv->val.binary.data);
		case AVRO_MAP:
		case AVRO_RECORD:
			return jv->type == jbvBinary && JsonContainerIsObject(jv->val.binary.data);
		default:
			return false;
	}
}

/*
 * Whether a union's branch goes by name in Avro's JSON encoding: a
 * primitive by its type's name, a named type by its full name
 * (namespace.name), or by its name alone.
 */
static bool
branch_is_named(avro_schema_t b, const char *name)
{
	const char *ns;

	if (!is_avro_named_type(b))
		return strcmp(type_name(b), name) == 0;
	if (strcmp(avro_schema_name(b), name) == 0)
		return true;
	ns = avro_schema_namespace(b);
	return ns != NULL && ns[0] != '\0' &&
		strncmp(name, ns, strlen(ns)) == 0 && name[strlen(ns)] == '.' &&
		strcmp(name + strlen(ns) + 1, avro_schema_name(b)) == 0;
}

/*
 * The tagged form {"name": value}: an object of one key that names a
 * branch of the union.  Returns the branch, or -1.
 */
static int
tagged_branch(avro_schema_t u, const JsonbValue *jv, JsonbValue *inner)
{
	JsonbIterator *it;
	JsonbValue	k;
	JsonbIteratorToken tok;
	char	   *name;
	int			disc;

	if (jv->type != jbvBinary || !JsonContainerIsObject(jv->val.binary.data) ||
		JsonContainerSize(jv->val.binary.data) != 1)
		return -1;
	it = JsonbIteratorInit(jv->val.binary.data);
	(void) JsonbIteratorNext(&it, &k, true);	/* WJB_BEGIN_OBJECT */
	tok = JsonbIteratorNext(&it, &k, true);
	if (tok != WJB_KEY)
		return -1;
	name = utf8_text(k.val.string.val, k.val.string.len);
	for (disc = 0; disc < (int) avro_schema_union_size(u); disc++)
		if (branch_is_named(resolved(avro_schema_union_branch(u, disc)), name))
		{
			(void) JsonbIteratorNext(&it, inner, true);
			return disc;
		}
	return -1;
}

static bool
put_union(AvroWalk *w, avro_value_t *dest, avro_schema_t u, const JsonbValue *jv)
{
	JsonbValue	inner;
	avro_value_t branch;
	int			disc = tagged_branch(u, jv, &inner);
	int			rc;
	size_t		i;

	/* the tag wins over a one-field record or map that happens to match it */
	if (disc >= 0)
	{
		if ((rc = avro_value_set_branch(dest, disc, &branch)) != 0)
			return avro_failed(w, rc);
		return put_value(w, &branch, &inner);
	}
	for (i = 0; i < avro_schema_union_size(u); i++)
	{
		if (!kind_fits(resolved(avro_schema_union_branch(u, (int) i)), jv))
			continue;
		if ((rc = avro_value_set_branch(dest, (int) i, &branch)) != 0)
			return avro_failed(w, rc);
		return put_value(w, &branch, jv);
	}
	return refuse(w, "no branch of the union takes %s%s", json_kind(jv), "");
}

static bool
put_array(AvroWalk *w, avro_value_t *dest, const JsonbValue *jv)
{
	JsonbIterator *it = JsonbIteratorInit(jv->val.binary.data);
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			saved = w->path.len;
	int			n = 0;

	while ((tok = JsonbIteratorNext(&it, &v, true)) != WJB_DONE)
	{
		avro_value_t child;
		int			rc;

		if (tok != WJB_ELEM)
			continue;
		if ((rc = avro_value_append(dest, &child, NULL)) != 0)
			return avro_failed(w, rc);
		appendStringInfo(&w->path, "[%d]", n++);
		if (!put_value(w, &child, &v))
			return false;
		w->path.len = saved;
		w->path.data[saved] = '\0';
	}
	return true;
}

/*
 * The path's next step: a record field by its name in the schema (not
 * the payload's), a map's key as [(a key)]: keys are the payload's data.
 */
static void
path_step(StringInfo path, const char *field)
{
	if (field != NULL)
		appendStringInfo(path, ".%s", field);
	else
		appendStringInfoString(path, "[(a key)]");
}

/* a record field the payload left out: null if its type takes it */
static bool
put_missing(AvroWalk *w, avro_value_t *field, avro_schema_t fs, const char *name)
{
	size_t		i;
	avro_value_t branch;
	int			rc;

	fs = resolved(fs);
	if (avro_typeof(fs) == AVRO_UNION)
		for (i = 0; i < avro_schema_union_size(fs); i++)
			if (avro_typeof(resolved(avro_schema_union_branch(fs, (int) i))) == AVRO_NULL)
			{
				if ((rc = avro_value_set_branch(field, (int) i, &branch)) != 0 ||
					(rc = avro_value_set_null(&branch)) != 0)
					return avro_failed(w, rc);
				return true;
			}
	return refuse(w, "field \"%s\" is missing (its type, %s, takes no null)",
				  name, type_name(fs));
}

static bool
put_object(AvroWalk *w, avro_value_t *dest, avro_schema_t s, const JsonbValue *jv)
{
	bool		record = (avro_typeof(s) == AVRO_RECORD);
	size_t		nfields = record ? avro_schema_record_size(s) : 0;
	bool	   *seen = record ? palloc0(sizeof(bool) * (nfields + 1)) : NULL;
	JsonbIterator *it = JsonbIteratorInit(jv->val.binary.data);
	JsonbValue	k;
	JsonbValue	v;
	JsonbIteratorToken tok;
	int			saved = w->path.len;
	size_t		i;
	int			rc;

	while ((tok = JsonbIteratorNext(&it, &k, true)) != WJB_DONE)
	{
		avro_value_t child;
		char	   *name;

		if (tok != WJB_KEY)
			continue;
		name = utf8_text(k.val.string.val, k.val.string.len);
		(void) JsonbIteratorNext(&it, &v, true);
		if (record)
		{
			int			idx = avro_schema_record_field_get_index(s, name);

			if (idx < 0)
				return refuse(w, "the object has a key that is not a field of record \"%s\"%s",
							  avro_schema_name(s), "");
			path_step(&w->path, avro_schema_record_field_name(s, idx));
			seen[idx] = true;
			rc = avro_value_get_by_index(dest, idx, &child, NULL);
		}
		else
		{
			path_step(&w->path, NULL);
			rc = avro_value_add(dest, name, &child, NULL, NULL);
		}
		if (rc != 0)
			return avro_failed(w, rc);
		if (!put_value(w, &child, &v))
			return false;
		w->path.len = saved;
		w->path.data[saved] = '\0';
	}
	for (i = 0; i < nfields; i++)
	{
		avro_value_t field;

		if (seen[i])
			continue;
		if ((rc = avro_value_get_by_index(dest, i, &field, NULL)) != 0)
			return avro_failed(w, rc);
		if (!put_missing(w, &field, avro_schema_record_field_get_by_index(s, (int) i),
						 avro_schema_record_field_name(s, (int) i)))
			return false;
	}
	return true;
}

static bool
put_value(AvroWalk *w, avro_value_t *dest, const JsonbValue *jv)
{
	avro_schema_t s = resolved(avro_value_get_schema(dest));
	bool		ok;

	if (++w->values > AVRO_WALK_MAX_VALUES)
		return refuse(w, "the payload makes more than %s Avro values%s", "1,000,000", "");
	if (w->depth >= AVRO_WALK_MAX_DEPTH)
		return refuse(w, "the payload nests deeper than %s levels%s", "100", "");
	w->depth++;
	ok = put_typed(w, dest, s, jv);
	w->depth--;
	return ok;
}

/* put_value's work, by the schema's type */
static bool
put_typed(AvroWalk *w, avro_value_t *dest, avro_schema_t s, const JsonbValue *jv)
{
	switch (avro_typeof(s))
	{
		case AVRO_UNION:
			return put_union(w, dest, s, jv);
		case AVRO_ARRAY:
			if (!kind_fits(s, jv))
				break;
			return put_array(w, dest, jv);
		case AVRO_MAP:
		case AVRO_RECORD:
			if (!kind_fits(s, jv))
				break;
			return put_object(w, dest, s, jv);
		default:
			return put_scalar(w, dest, s, jv);
	}
	return refuse(w, "expected %s, found %s", type_name(s), json_kind(jv));
}

/*
 * OutboxAvroParse
 *		A registry's schema text parsed (hostile input: avro-c judges it).
 *		Returns NULL with err set when avro-c refuses it.  The result is
 *		malloc'd by avro-c; OutboxAvroFree releases it.
 */
/*
 * Whether record s reaches itself through record fields alone, or nests
 * records deeper than AVRO_WALK_MAX_DEPTH: avro-c makes a record's fields
 * when it makes the record, so such a schema would recurse without end.
 * Through a union, an array or a map the recursion stops (none is made
 * until the payload says).
 */
static bool
record_recurses(avro_schema_t s, avro_schema_t *visiting, int depth)
{
	size_t		i;
	int			j;

	if (depth >= AVRO_WALK_MAX_DEPTH)
		return true;
	for (j = 0; j < depth; j++)
		if (visiting[j] == s)
			return true;
	visiting[depth] = s;
	for (i = 0; i < avro_schema_record_size(s); i++)
	{
		avro_schema_t f = resolved(avro_schema_record_field_get_by_index(s, (int) i));

		if (avro_typeof(f) == AVRO_RECORD && record_recurses(f, visiting, depth + 1))
			return true;
	}
	return false;
}

OutboxAvroSchema *
OutboxAvroParse(int32 id, const char *json, size_t len, char *err, size_t errlen)
{
	OutboxAvroSchema *s = palloc0(sizeof(OutboxAvroSchema));
	avro_schema_t visiting[AVRO_WALK_MAX_DEPTH];
	char		msg[192];

	s->id = id;
	if (avro_schema_from_json_length(json, len, &s->schema) != 0)
	{
		snprintf(err, errlen, "schema %d is not an Avro schema avro-c reads: %s",
				 id, avro_message(msg, sizeof(msg)));
		pfree(s);
		return NULL;
	}
	if (avro_typeof(resolved(s->schema)) == AVRO_RECORD &&
		record_recurses(resolved(s->schema), visiting, 0))
	{
		snprintf(err, errlen, "schema %d has a record that contains itself, or records nested deeper than %d, "
				 "other than through a union, an array or a map: no value can be made of it",
				 id, AVRO_WALK_MAX_DEPTH);
		avro_schema_decref(s->schema);
		pfree(s);
		return NULL;
	}
	s->iface = avro_generic_class_from_schema(s->schema);
	if (s->iface == NULL || avro_generic_value_new(s->iface, &s->value) != 0)
	{
		snprintf(err, errlen, "schema %d: avro-c cannot make a value of it: %s",
				 id, avro_message(msg, sizeof(msg)));
		if (s->iface != NULL)
			avro_value_iface_decref(s->iface);
		avro_schema_decref(s->schema);
		pfree(s);
		return NULL;
	}
	return s;
}

void
OutboxAvroFree(OutboxAvroSchema *s)
{
	if (s == NULL)
		return;
	if (s->value.iface != NULL)
		avro_value_decref(&s->value);
	avro_value_iface_decref(s->iface);
	avro_schema_decref(s->schema);
	pfree(s);
}

int32
OutboxAvroSchemaId(const OutboxAvroSchema *s)
{
	return s->id;
}

/*
 * OutboxAvroEncode
 *		payload as the schema's record, framed: palloc'd in the current
 *		context, *len its length.  NULL with err set (naming the field and
 *		the schema id) when it does not fit.
 */
char *
OutboxAvroEncode(OutboxAvroSchema *s, Jsonb *payload, size_t *len,
				 char *err, size_t errlen)
{
	AvroWalk	w;
	JsonbValue	root;
	size_t		size;
	char	   *buf;
	avro_writer_t writer;
	int			rc;

	w.err = err;
	w.errlen = errlen;
	w.id = s->id;
	initStringInfo(&w.path);
	appendStringInfoChar(&w.path, '$');
	if (JB_ROOT_IS_SCALAR(payload))
		(void) JsonbExtractScalar(&payload->root, &root);
	else
	{
		root.type = jbvBinary;
		root.val.binary.data = &payload->root;
		root.val.binary.len = VARSIZE(payload) - VARHDRSZ;
	}
	w.depth = 0;
	w.values = 0;
	if (s->value.iface == NULL && (rc = avro_generic_value_new(s->iface, &s->value)) != 0)
	{
		s->value.iface = NULL;
		(void) avro_failed(&w, rc);
		return NULL;
	}
	avro_value_reset(&s->value);
	if (!put_value(&w, &s->value, &root))
		return NULL;
	if ((rc = avro_value_sizeof(&s->value, &size)) != 0)
	{
		(void) avro_failed(&w, rc);
		return NULL;
	}
	if (size > MaxAllocSize - 5)
	{
		(void) refuse(&w, "the record is larger than %s%s", "1 GB", "");
		return NULL;
	}
	buf = palloc(size + 5);
	buf[0] = 0;
	buf[1] = (char) ((uint32) s->id >> 24);
	buf[2] = (char) ((uint32) s->id >> 16);
	buf[3] = (char) ((uint32) s->id >> 8);
	buf[4] = (char) ((uint32) s->id);
	writer = avro_writer_memory(buf + 5, (int64_t) size);
	rc = writer == NULL ? ENOMEM : avro_value_write(writer, &s->value);
	if (writer != NULL)
		avro_writer_free(writer);
	if (rc != 0)
	{
		(void) avro_failed(&w, rc);
		return NULL;
	}
	/* avro-c keeps a large value's room: made anew at the next event */
	if (size > AVRO_VALUE_RENEW_BYTES)
	{
		avro_value_decref(&s->value);
		s->value.iface = NULL;
	}
	*len = size + 5;
	return buf;
}
