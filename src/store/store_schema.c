/*-------------------------------------------------------------------------
 *
 * store/store_schema.c
 *		outbox.schemas: the latest Avro schema of a topic, as the relay
 *		fetched it from the schema registry, recorded for validate().
 *
 *-------------------------------------------------------------------------
 */
#include "postgres.h"

#include "catalog/namespace.h"
#include "catalog/pg_type_d.h"
#include "utils/builtins.h"
#include "utils/lsyscache.h"

#include "store/store.h"

/*
 * OutboxStoreRecordSchema
 *		Record topic's schema id and text (the relay's transaction; a
 *		database before 1.8 has no outbox.schemas, and records nothing).
 */
void
OutboxStoreRecordSchema(const char *topic, int32 id, const char *json)
{
	Oid			types[3] = {TEXTOID, INT4OID, TEXTOID};
	Datum		values[3];

	Oid			nsp = get_namespace_oid("outbox", true);

	if (!OidIsValid(nsp) || !OidIsValid(get_relname_relid("schemas", nsp)))
		return;
	values[0] = CStringGetTextDatum(topic);
	values[1] = Int32GetDatum(id);
	values[2] = CStringGetTextDatum(json);
	SPI_connect();
	OutboxSpiExec("INSERT INTO outbox.schemas AS s (topic, schema_id, schema)"
				  " VALUES ($1, $2, $3)"
				  " ON CONFLICT (topic) DO UPDATE"
				  " SET schema_id = excluded.schema_id, schema = excluded.schema,"
				  " fetched_at = pg_catalog.now()",
				  3, types, values, NULL, false, 0, SPI_OK_INSERT, "recording a topic's schema");
	SPI_finish();
}
