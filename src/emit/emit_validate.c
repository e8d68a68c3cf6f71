/*-------------------------------------------------------------------------
 *
 * emit/emit_validate.c
 *		outbox.validate(topic, payload): whether a payload fits the Avro
 *		schema the relay would encode it with, before the application
 *		commits; without the network, against the schema the relay last
 *		fetched (outbox.schemas).
 *
 * Invariants:
 *	- SECURITY DEFINER with search_path pinned (outbox.sql): the caller
 *	  needs no right on outbox.schemas, and reads nothing but the verdict.
 *	- The verdict is the relay's own: the same encoder (registry_avro.c)
 *	  with the same schema text, so what validate() accepts the relay
 *	  sends, as long as the registry's latest schema is the one recorded.
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/pg_type_d.h"
#include "executor/spi.h"
#include "fmgr.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "base/base.h"
#include "emit/emit.h"
#include "registry/registry.h"

PG_FUNCTION_INFO_V1(outbox_validate);

Datum
outbox_validate(PG_FUNCTION_ARGS)
{
	char	   *topic = text_to_cstring(PG_GETARG_TEXT_PP(0));
	Jsonb	   *payload = PG_GETARG_JSONB_P(1);
	char		err[OUTBOX_REGISTRY_ERROR_LEN] = "";
	MemoryContext caller = CurrentMemoryContext;
	OutboxAvroSchema *schema;
	bool		isnull;
	int32		id;
	char	   *json;
	size_t		len;
	static SPIPlanPtr plan = NULL;
	Datum		arg[1];

	if (!OutboxTopicIsAvro(topic))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("topic \"%s\" is not an Avro topic", topic),
				 errdetail("outbox.avro_topics does not name it: its events are sent as JSON.")));
	SPI_connect();
	if (plan == NULL)
	{
		Oid			types[1] = {TEXTOID};

		/* kept (SPI_keepplan): an application may check every payload */
		plan = OutboxSpiPrepareGeneric("SELECT schema_id, schema FROM outbox.schemas"
									   " WHERE topic OPERATOR(pg_catalog.=) $1",
									   1, types, "reading the topic's schema");
	}
	arg[0] = CStringGetTextDatum(topic);
	if (SPI_execute_plan(plan, arg, NULL, true, 1) != SPI_OK_SELECT)
		elog(ERROR, "reading the topic's schema failed");
	if (SPI_processed == 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("no Avro schema is known yet for topic \"%s\"", topic),
				 errdetail("The relay records a topic's schema when it first fetches it from outbox.schema_registry_url (subject \"%s-value\").",
						   topic),
				 errhint("Check the relay's last_error in outbox.status(); it fetches the schemas of outbox.avro_topics when it starts and at each reload.")));
	id = DatumGetInt32(OutboxSpiValue(1, &isnull));
	/* out of SPI's memory, which SPI_finish frees */
	json = MemoryContextStrdup(caller, TextDatumGetCString(OutboxSpiValue(2, &isnull)));
	SPI_finish();

	if ((schema = OutboxRegistrySchemaById(id, json, err, sizeof(err))) == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_DATA_CORRUPTED),
				 errmsg("the schema recorded for topic \"%s\" cannot be used", topic),
				 errdetail("%s", err)));
	if (OutboxAvroEncode(schema, payload, &len, err, sizeof(err)) == NULL)
		PG_RETURN_TEXT_P(cstring_to_text(err));
	PG_RETURN_NULL();
}
