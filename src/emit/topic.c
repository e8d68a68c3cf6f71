/*-------------------------------------------------------------------------
 *
 * emit/topic.c
 *		Kafka topic names: legality, outbox.topic_template, and the
 *		outbox.allowed_topics patterns emit() must match.
 *
 * Invariants:
 *	- One test of a topic name character (is_topic_char) serves the name
 *	  check, the template check and the pattern check, so a template or
 *	  pattern can only hold characters a name can.
 *	- Template expansion and the template check share one table of
 *	  placeholders: a template the check hook accepted always expands.
 *	- OutboxTopicResolve gives emit() a topic Kafka accepts and
 *	  outbox.allowed_topics allows, or raises the error a user sees;
 *	  nothing here keeps state between calls.
 *	- What the check hooks call (OutboxTopicTemplateIsValid,
 *	  OutboxTopicPatternsAreValid) never ereports: it returns false with a
 *	  palloc'd detail sentence.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "lib/stringinfo.h"

#include "base/base.h"
#include "emit/emit.h"

/*
 * Template placeholders.  Expansion and validation share this table so a
 * template the check hook accepted always expands.
 */
#define PLACEHOLDER_AGGREGATE_TYPE	0
#define PLACEHOLDER_EVENT_TYPE		1

static const char *const placeholders[] = {"{aggregate_type}", "{event_type}"};

/* Kafka's topic name characters: [A-Za-z0-9._-] */
static bool
is_topic_char(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
		(c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

/*
 * topic_name_is_legal
 *		Whether Kafka accepts this topic name.
 *
 * Kafka allows 1..249 characters from [A-Za-z0-9._-], except "." and "..".
 */
static bool
topic_name_is_legal(const char *name, int len)
{
	int			i;

	if (len < 1 || len > OUTBOX_TOPIC_MAX_LEN)
		return false;
	if ((len == 1 && name[0] == '.') ||
		(len == 2 && name[0] == '.' && name[1] == '.'))
		return false;
	for (i = 0; i < len; i++)
		if (!is_topic_char(name[i]))
			return false;
	return true;
}

static int
match_placeholder(const char *p)
{
	int			i;

	for (i = 0; i < lengthof(placeholders); i++)
		if (strncmp(p, placeholders[i], strlen(placeholders[i])) == 0)
			return i;
	return -1;
}

/*
 * OutboxTopicTemplateIsValid
 *		Check outbox.topic_template; on failure *bad gets a detail sentence.
 */
bool
OutboxTopicTemplateIsValid(const char *tmpl, char **bad)
{
	const char *p;

	if (tmpl == NULL || tmpl[0] == '\0')
	{
		*bad = pstrdup("The template must not be empty.");
		return false;
	}
	for (p = tmpl; *p; p++)
	{
		int			ph;

		if (*p != '{')
		{
			if (!is_topic_char(*p))
			{
				*bad = psprintf("Character \"%c\" cannot appear in a Kafka topic name.", *p);
				return false;
			}
			continue;
		}
		ph = match_placeholder(p);
		if (ph < 0)
		{
			*bad = pstrdup("The only placeholders are {aggregate_type} and {event_type}.");
			return false;
		}
		p += strlen(placeholders[ph]) - 1;
	}
	return true;
}

static char *
expand_topic_template(const char *tmpl, const char *aggregate_type,
					  const char *event_type)
{
	StringInfoData buf;
	const char *p;

	initStringInfo(&buf);
	for (p = tmpl; *p; p++)
	{
		int			ph = (*p == '{') ? match_placeholder(p) : -1;

		if (ph < 0)
		{
			appendStringInfoChar(&buf, *p);
			continue;
		}
		appendStringInfoString(&buf, ph == PLACEHOLDER_AGGREGATE_TYPE ?
							   aggregate_type : event_type);
		p += strlen(placeholders[ph]) - 1;
	}
	return buf.data;
}

/* an unset or all-blank outbox.allowed_topics allows every topic */
static bool
patterns_are_empty(const char *patterns)
{
	return patterns == NULL || strspn(patterns, " ") == strlen(patterns);
}

/*
 * next_pattern
 *		The next comma-separated entry of outbox.allowed_topics, trimmed of
 *		spaces: *start and *len, and where to go on.  NULL at the end.
 */
static const char *
next_pattern(const char *p, const char **start, int *len)
{
	const char *end;

	if (*p == '\0')
		return NULL;
	end = strchr(p, ',');
	if (end == NULL)
		end = p + strlen(p);
	while (p < end && *p == ' ')
		p++;
	*start = p;
	*len = (int) (end - p);
	while (*len > 0 && p[*len - 1] == ' ')
		(*len)--;
	return *end == ',' ? end + 1 : end;
}

/*
 * OutboxTopicPatternsAreValid
 *		Check outbox.allowed_topics: empty, or comma-separated patterns of
 *		topic name characters and '*'.  On failure *bad gets a detail
 *		sentence.
 */
bool
OutboxTopicPatternsAreValid(const char *patterns, char **bad)
{
	const char *p = patterns;
	const char *start;
	int			len;
	int			n = 0;

	if (patterns_are_empty(patterns))
		return true;
	while ((p = next_pattern(p, &start, &len)) != NULL)
	{
		int			i;

		n++;
		if (len == 0)
		{
			*bad = psprintf("Entry %d of the list is empty.", n);
			return false;
		}
		for (i = 0; i < len; i++)
			if (start[i] != '*' && !is_topic_char(start[i]))
			{
				*bad = psprintf("Character \"%c\" cannot appear in a topic pattern: "
								"patterns have characters from [A-Za-z0-9._-] and the wildcard \"*\".",
								start[i]);
				return false;
			}
	}
	return true;
}

/*
 * pattern_matches
 *		Whether topic matches pattern[0..plen), '*' matching any run of
 *		characters, possibly empty.  Greedy with one backtrack point: the
 *		last '*' seen is the only one worth retrying.
 */
static bool
pattern_matches(const char *pattern, int plen, const char *topic)
{
	int			p = 0;
	int			star = -1;
	const char *t = topic;
	const char *star_t = NULL;

	while (*t)
	{
		if (p < plen && pattern[p] == '*')
		{
			star = p++;
			star_t = t;
		}
		else if (p < plen && pattern[p] == *t)
		{
			p++;
			t++;
		}
		else if (star >= 0)
		{
			p = star + 1;
			t = ++star_t;
		}
		else
			return false;
	}
	while (p < plen && pattern[p] == '*')
		p++;
	return p == plen;
}

/*
 * topic_is_allowed
 *		Whether outbox.allowed_topics lets emit() write to topic.
 */
static bool
topic_is_allowed(const char *topic)
{
	const char *p = outbox_allowed_topics;
	const char *start;
	int			len;

	if (patterns_are_empty(p))
		return true;
	while ((p = next_pattern(p, &start, &len)) != NULL)
		if (pattern_matches(start, len, topic))
			return true;
	return false;
}

/*
 * OutboxTopicResolve
 *		The topic of an event: topic when the caller gave one (not NULL),
 *		else outbox.topic_template expanded with its aggregate and event
 *		types.  Raises an error when Kafka would refuse the name (with a
 *		hint naming the template when it came from there), then when
 *		outbox.allowed_topics does not allow it.  The result is palloc'd.
 */
char *
OutboxTopicResolve(char *topic, const char *aggregate_type,
				   const char *event_type)
{
	bool		from_template = (topic == NULL);

	if (from_template)
		topic = expand_topic_template(outbox_topic_template,
									  aggregate_type, event_type);
	if (!topic_name_is_legal(topic, strlen(topic)))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid Kafka topic name \"%s\"", topic),
				 errdetail("A topic name has 1 to 249 characters from [A-Za-z0-9._-] and is not \".\" or \"..\"."),
				 from_template ?
				 errhint("The name comes from outbox.topic_template \"%s\"; pass a topic or change the template.",
						 outbox_topic_template) : 0));
	if (!topic_is_allowed(topic))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("events cannot be emitted to topic \"%s\"", topic),
				 errdetail("The topic does not match outbox.allowed_topics."),
				 errhint("A superuser sets outbox.allowed_topics.")));
	return topic;
}

/*
 * OutboxTopicNameIsLegal
 *		Whether Kafka accepts name as a topic (subscribe() checks its topics).
 */
bool
OutboxTopicNameIsLegal(const char *name)
{
	return topic_name_is_legal(name, (int) strlen(name));
}
