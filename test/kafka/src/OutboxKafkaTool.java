/*
 * OutboxKafkaTool: the tests' independent reader of Apache Kafka, written
 * with Kafka's own Java client (test tool only, never installed).
 *
 *   ready BOOTSTRAP N SECONDS      wait until N brokers answer and a write
 *                                  with acks=all to a probe topic succeeds
 *   read BOOTSTRAP TOPIC [k=v...]  every message of TOPIC from the beginning
 *                                  up to its end offsets at the start, one
 *                                  JSON line each (see below); exit 3 when
 *                                  the topic does not exist
 *   cloudevents BOOTSTRAP TOPIC [k=v...]
 *                                  the same, each line with "cloudevent": the
 *                                  message as the CloudEvents SDK's Kafka
 *                                  deserializer decodes it (binary or
 *                                  structured mode, by its content-type)
 *   frames BOOTSTRAP TOPIC SCHEMA_FILE [k=v...]
 *                                  the same, each line with "frame": the
 *                                  value read as a schema registry's wire
 *                                  format, {"magic","schema_id","avro": the
 *                                  record Apache Avro decodes from the rest
 *                                  with the schema in SCHEMA_FILE, as JSON
 *                                  text}, or {"error": why not}
 *   registry BOOTSTRAP TOPIC URL [k=v...]
 *                                  as frames, the schema of each record
 *                                  fetched by the frame's id from the schema
 *                                  registry's Confluent-compatible API at URL
 *                                  (GET URL/schemas/ids/ID), as a
 *                                  Confluent-style deserializer does
 *   registry-stand-in PORT [USER:PASSWORD]
 *                                  a schema registry STAND-IN, not a
 *                                  registry: the few calls of Confluent's
 *                                  REST API the tests make (POST
 *                                  .../subjects/S/versions, GET
 *                                  .../subjects/S/versions/latest, GET
 *                                  .../schemas/ids/ID, under any path
 *                                  prefix), in memory, on 127.0.0.1:PORT;
 *                                  with USER:PASSWORD, basic auth required
 *   leaders BOOTSTRAP TOPIC        one line per partition: partition leader isr
 *   partition N KEY...             the partition Java's default partitioner
 *                                  picks for each key among N partitions
 *
 * A read line: {"partition":P,"offset":O,"key":K,"value":V,"value_hex":X,
 * "headers":[[name,value],...],"java_partition":J} where X is the value's
 * bytes in hex (null for a null value) and J is
 * toPositive(murmur2(key bytes)) % partitions of the topic: the partition
 * the Java producer's default partitioner would have chosen for that key.
 * Keys, values and header values are decoded as UTF-8; null stays null.
 * A "cloudevent" is {"specversion","id","source","type","subject",
 * "datacontenttype","time_us" (microseconds since 1970),"extensions":{...},
 * "data" (UTF-8 text), "data_hex"}, or {"error": why the SDK refused the
 * message}.
 * This program shares no code with the relay: it is how tests check it.
 */

import java.io.BufferedOutputStream;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.TimeUnit;

import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.clients.producer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.*;
import org.apache.kafka.common.utils.Utils;

import io.cloudevents.CloudEvent;
import io.cloudevents.kafka.CloudEventDeserializer;

public class OutboxKafkaTool
{
	static int javaPartition(byte[] key, int n)
	{
		return Utils.toPositive(Utils.murmur2(key)) % n;
	}

	static void json(StringBuilder sb, String s)
	{
		if (s == null)
		{
			sb.append("null");
			return;
		}
		sb.append('"');
		for (int i = 0; i < s.length(); i++)
		{
			char c = s.charAt(i);
			switch (c)
			{
				case '"': sb.append("\\\""); break;
				case '\\': sb.append("\\\\"); break;
				case '\n': sb.append("\\n"); break;
				case '\r': sb.append("\\r"); break;
				case '\t': sb.append("\\t"); break;
				default:
					if (c < 0x20)
						sb.append(String.format("\\u%04x", (int) c));
					else
						sb.append(c);
			}
		}
		sb.append('"');
	}

	static String hex(byte[] b)
	{
		if (b == null)
			return null;
		StringBuilder sb = new StringBuilder();
		for (byte x : b)
			sb.append(String.format("%02x", x & 0xff));
		return sb.toString();
	}

	/* a schema registry's schemas by id, fetched once each */
	static java.util.function.IntFunction<org.apache.avro.Schema> registry(String url)
	{
		Map<Integer, org.apache.avro.Schema> cache = new HashMap<>();
		java.net.http.HttpClient http = java.net.http.HttpClient.newHttpClient();
		/* http://user:password@host/...: basic auth, the URL without them */
		java.net.URI u = java.net.URI.create(url);
		String auth = u.getUserInfo() == null ? null :
			"Basic " + Base64.getEncoder().encodeToString(u.getUserInfo().getBytes(StandardCharsets.UTF_8));
		String base = auth == null ? url : url.replace(u.getUserInfo() + "@", "");
		com.fasterxml.jackson.databind.ObjectMapper mapper = new com.fasterxml.jackson.databind.ObjectMapper();

		return id -> cache.computeIfAbsent(id, k -> {
			try
			{
				java.net.http.HttpRequest.Builder req =
					java.net.http.HttpRequest.newBuilder(java.net.URI.create(base + "/schemas/ids/" + k))
					.timeout(Duration.ofSeconds(10)).GET();
				if (auth != null)
					req.header("Authorization", auth);
				java.net.http.HttpResponse<String> r = http.send(req.build(),
					java.net.http.HttpResponse.BodyHandlers.ofString());
				if (r.statusCode() != 200)
					throw new IllegalStateException("registry answered HTTP " + r.statusCode() + " for id " + k);
				return new org.apache.avro.Schema.Parser().parse(mapper.readTree(r.body()).get("schema").asText());
			}
			catch (java.io.IOException | InterruptedException x)
			{
				throw new IllegalStateException(x);
			}
		});
	}

	/* the value as a registry's wire format, its record decoded by Avro */
	static void frame(StringBuilder out, java.util.function.IntFunction<org.apache.avro.Schema> schemas, byte[] v)
	{
		out.append(",\"frame\":{");
		try
		{
			java.nio.ByteBuffer bb = java.nio.ByteBuffer.wrap(v);
			byte magic = bb.get();
			int id = bb.getInt();
			org.apache.avro.Schema schema = schemas.apply(id);
			org.apache.avro.io.BinaryDecoder dec =
				org.apache.avro.io.DecoderFactory.get().binaryDecoder(v, 5, v.length - 5, null);
			Object rec = new org.apache.avro.generic.GenericDatumReader<Object>(schema).read(null, dec);
			if (!dec.isEnd())
				throw new IllegalStateException("bytes are left after the record");
			out.append("\"magic\":").append(magic).append(",\"schema_id\":").append(id)
				.append(",\"avro\":");
			json(out, rec.toString());
		}
		catch (Exception x)
		{
			out.append("\"error\":");
			json(out, x.toString());
		}
		out.append('}');
	}

	static String str(byte[] b)
	{
		return b == null ? null : new String(b, StandardCharsets.UTF_8);
	}

	static Properties props(String boot, String[] args, int from)
	{
		Properties p = new Properties();
		p.put("bootstrap.servers", boot);
		for (int i = from; i < args.length; i++)
		{
			int eq = args[i].indexOf('=');
			p.put(args[i].substring(0, eq), args[i].substring(eq + 1));
		}
		return p;
	}

	static int ready(String boot, int n, int seconds) throws Exception
	{
		long deadline = System.currentTimeMillis() + seconds * 1000L;
		Properties p = props(boot, new String[0], 0);
		p.put("request.timeout.ms", "5000");
		p.put("default.api.timeout.ms", "5000");
		String last = "";

		while (System.currentTimeMillis() < deadline)
		{
			try (Admin admin = Admin.create(p))
			{
				int up = admin.describeCluster().nodes().get(5, TimeUnit.SECONDS).size();
				if (up < n)
				{
					last = up + " of " + n + " brokers up";
					Thread.sleep(300);
					continue;
				}
				try
				{
					admin.createTopics(List.of(new NewTopic("__outbox_ready", 1, (short) Math.min(n, 3))))
						.all().get(10, TimeUnit.SECONDS);
				}
				catch (java.util.concurrent.ExecutionException e)
				{
					if (!(e.getCause() instanceof org.apache.kafka.common.errors.TopicExistsException))
						throw e;
				}
				Properties pp = props(boot, new String[0], 0);
				pp.put("acks", "all");
				pp.put("delivery.timeout.ms", "10000");
				pp.put("request.timeout.ms", "5000");
				pp.put("linger.ms", "0");
				try (Producer<byte[], byte[]> prod = new KafkaProducer<>(pp, new ByteArraySerializer(), new ByteArraySerializer()))
				{
					prod.send(new ProducerRecord<>("__outbox_ready", "ready".getBytes())).get(12, TimeUnit.SECONDS);
				}
				return 0;
			}
			catch (Exception e)
			{
				last = e.toString();
				Thread.sleep(300);
			}
		}
		System.err.println("cluster not ready: " + last);
		return 1;
	}

	/* the record as the CloudEvents SDK reads it (see the header) */
	static void cloudEvent(StringBuilder out, CloudEventDeserializer d, ConsumerRecord<byte[], byte[]> r)
	{
		CloudEvent e;

		out.append(",\"cloudevent\":{");
		try
		{
			e = d.deserialize(r.topic(), r.headers(), r.value());
		}
		catch (RuntimeException x)
		{
			out.append("\"error\":");
			json(out, x.toString());
			out.append('}');
			return;
		}
		String[][] attrs = {
			{"specversion", e.getSpecVersion().toString()}, {"id", e.getId()},
			{"source", e.getSource() == null ? null : e.getSource().toString()},
			{"type", e.getType()}, {"subject", e.getSubject()},
			{"datacontenttype", e.getDataContentType()}};
		for (String[] a : attrs)
		{
			json(out, a[0]);
			out.append(':');
			json(out, a[1]);
			out.append(',');
		}
		out.append("\"time_us\":").append(e.getTime() == null ? "null" :
			Long.toString(e.getTime().toEpochSecond() * 1000000L + e.getTime().getNano() / 1000));
		out.append(",\"extensions\":{");
		boolean first = true;
		for (String name : new TreeSet<>(e.getExtensionNames()))
		{
			if (!first)
				out.append(',');
			first = false;
			json(out, name);
			out.append(':');
			json(out, String.valueOf(e.getExtension(name)));
		}
		out.append("},\"data\":");
		json(out, e.getData() == null ? null : str(e.getData().toBytes()));
		out.append(",\"data_hex\":");
		json(out, e.getData() == null ? null : hex(e.getData().toBytes()));
		out.append('}');
	}

	static int read(String boot, String topic, String[] args) throws Exception
	{
		return read(boot, topic, args, false, null, 3);
	}

	/* with ce, each line's "cloudevent"; with schema, its "frame" */
	static int read(String boot, String topic, String[] args, boolean ce,
					java.util.function.IntFunction<org.apache.avro.Schema> schema, int nargs) throws Exception
	{
		CloudEventDeserializer ced = new CloudEventDeserializer();
		Properties p = props(boot, args, nargs);
		p.putIfAbsent("enable.auto.commit", "false");
		p.putIfAbsent("max.partition.fetch.bytes", "10485760");
		p.putIfAbsent("default.api.timeout.ms", "20000");

		try (KafkaConsumer<byte[], byte[]> c = new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer()))
		{
			Map<String, List<PartitionInfo>> all = c.listTopics(Duration.ofSeconds(20));
			List<PartitionInfo> infos = all.get(topic);
			if (infos == null || infos.isEmpty())
			{
				System.err.println("topic " + topic + " does not exist");
				return 3;
			}
			int nparts = infos.size();
			List<TopicPartition> tps = new ArrayList<>();
			for (PartitionInfo pi : infos)
				tps.add(new TopicPartition(topic, pi.partition()));
			c.assign(tps);
			c.seekToBeginning(tps);
			Map<TopicPartition, Long> end = c.endOffsets(tps, Duration.ofSeconds(20));
			long deadline = System.currentTimeMillis() + 60000;
			StringBuilder out = new StringBuilder();

			while (true)
			{
				boolean done = true;
				for (TopicPartition tp : tps)
					if (c.position(tp, Duration.ofSeconds(20)) < end.get(tp))
						done = false;
				if (done)
					break;
				if (System.currentTimeMillis() > deadline)
				{
					System.err.println("timed out reading " + topic);
					return 1;
				}
				for (ConsumerRecord<byte[], byte[]> r : c.poll(Duration.ofMillis(500)))
				{
					if (r.offset() >= end.get(new TopicPartition(topic, r.partition())))
						continue;
					out.setLength(0);
					out.append("{\"partition\":").append(r.partition())
						.append(",\"offset\":").append(r.offset())
						.append(",\"key\":");
					json(out, str(r.key()));
					out.append(",\"value\":");
					json(out, str(r.value()));
					out.append(",\"value_hex\":");
					json(out, hex(r.value()));
					out.append(",\"headers\":[");
					boolean first = true;
					for (Header h : r.headers())
					{
						if (!first)
							out.append(',');
						first = false;
						out.append('[');
						json(out, h.key());
						out.append(',');
						json(out, str(h.value()));
						out.append(']');
					}
					out.append("],\"java_partition\":");
					out.append(r.key() == null ? "null" : Integer.toString(javaPartition(r.key(), nparts)));
					if (ce)
						cloudEvent(out, ced, r);
					if (schema != null && r.value() != null)
						frame(out, schema, r.value());
					out.append('}');
					System.out.println(out);
				}
			}
		}
		System.out.flush();
		return 0;
	}

	/* the registry stand-in's answer */
	static void answer(com.sun.net.httpserver.HttpExchange x, int status, String body) throws java.io.IOException
	{
		byte[] b = body.getBytes(StandardCharsets.UTF_8);
		x.getResponseHeaders().set("Content-Type", "application/vnd.schemaregistry.v1+json");
		x.sendResponseHeaders(status, b.length);
		x.getResponseBody().write(b);
		x.close();
	}

	static int registryStandIn(int port, String userinfo) throws Exception
	{
		com.fasterxml.jackson.databind.ObjectMapper mapper = new com.fasterxml.jackson.databind.ObjectMapper();
		List<String> schemas = new ArrayList<>();	/* id i+1 */
		Map<String, List<Integer>> subjects = new HashMap<>();
		String auth = userinfo == null ? null :
			"Basic " + Base64.getEncoder().encodeToString(userinfo.getBytes(StandardCharsets.UTF_8));
		com.sun.net.httpserver.HttpServer server =
			com.sun.net.httpserver.HttpServer.create(new java.net.InetSocketAddress("127.0.0.1", port), 16);

		server.createContext("/", x -> {
			String path = x.getRequestURI().getPath();
			java.util.regex.Matcher m;
			synchronized (schemas)
			{
				if (auth != null && !auth.equals(x.getRequestHeaders().getFirst("Authorization")))
					answer(x, 401, "{\"error_code\":401,\"message\":\"Unauthorized\"}");
				else if ((m = java.util.regex.Pattern.compile(".*/subjects/([^/]+)/versions").matcher(path)).matches() &&
						 x.getRequestMethod().equals("POST"))
				{
					String schema = mapper.readTree(x.getRequestBody()).get("schema").asText();
					int id = schemas.indexOf(schema) + 1;
					if (id == 0)
					{
						schemas.add(schema);
						id = schemas.size();
					}
					List<Integer> versions = subjects.computeIfAbsent(m.group(1), k -> new ArrayList<>());
					if (versions.isEmpty() || versions.get(versions.size() - 1) != id)
						versions.add(id);
					answer(x, 200, "{\"id\":" + id + "}");
				}
				else if ((m = java.util.regex.Pattern.compile(".*/subjects/([^/]+)/versions/latest").matcher(path)).matches())
				{
					List<Integer> versions = subjects.get(m.group(1));
					if (versions == null)
						answer(x, 404, "{\"error_code\":40401,\"message\":\"Subject not found.\"}");
					else
					{
						int id = versions.get(versions.size() - 1);
						answer(x, 200, mapper.createObjectNode().put("subject", m.group(1))
							   .put("version", versions.size()).put("id", id)
							   .put("schema", schemas.get(id - 1)).toString());
					}
				}
				else if ((m = java.util.regex.Pattern.compile(".*/schemas/ids/([0-9]+)").matcher(path)).matches() &&
						 Integer.parseInt(m.group(1)) >= 1 && Integer.parseInt(m.group(1)) <= schemas.size())
					answer(x, 200, mapper.createObjectNode()
						   .put("schema", schemas.get(Integer.parseInt(m.group(1)) - 1)).toString());
				else
					answer(x, 404, "{\"error_code\":404,\"message\":\"Not found.\"}");
			}
		});
		server.start();
		System.out.println("listening " + port);
		System.out.flush();
		Thread.currentThread().join();
		return 0;
	}

	static int leaders(String boot, String topic) throws Exception
	{
		Properties p = props(boot, new String[0], 0);
		try (Admin admin = Admin.create(p))
		{
			TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames()
				.get(20, TimeUnit.SECONDS).get(topic);
			for (TopicPartitionInfo pi : d.partitions())
			{
				StringBuilder isr = new StringBuilder();
				for (Node nd : pi.isr())
					isr.append(isr.length() > 0 ? "," : "").append(nd.id());
				System.out.println(pi.partition() + " " + (pi.leader() == null ? -1 : pi.leader().id()) + " " + isr);
			}
		}
		return 0;
	}

	public static void main(String[] args) throws Exception
	{
		int rc;

		/* UTF-8 out whatever the locale: with none set, Java prints '?' for
		 * every character outside ASCII */
		System.setOut(new PrintStream(new BufferedOutputStream(new FileOutputStream(FileDescriptor.out)),
									  false, StandardCharsets.UTF_8));

		switch (args.length > 0 ? args[0] : "")
		{
			case "ready":
				rc = ready(args[1], Integer.parseInt(args[2]), Integer.parseInt(args[3]));
				break;
			case "read":
				rc = read(args[1], args[2], args);
				break;
			case "cloudevents":
				rc = read(args[1], args[2], args, true, null, 3);
				break;
			case "frames":
				org.apache.avro.Schema fixed = new org.apache.avro.Schema.Parser().parse(new java.io.File(args[3]));
				rc = read(args[1], args[2], args, false, id -> fixed, 4);
				break;
			case "registry":
				rc = read(args[1], args[2], args, false, registry(args[3]), 4);
				break;
			case "registry-stand-in":
				rc = registryStandIn(Integer.parseInt(args[1]), args.length > 2 ? args[2] : null);
				break;
			case "leaders":
				rc = leaders(args[1], args[2]);
				break;
			case "partition":
				int n = Integer.parseInt(args[1]);
				for (int i = 2; i < args.length; i++)
					System.out.println(args[i] + " " + javaPartition(args[i].getBytes(StandardCharsets.UTF_8), n));
				rc = 0;
				break;
			default:
				System.err.println("usage: OutboxKafkaTool ready|read|cloudevents|frames|registry|leaders|partition ...");
				rc = 2;
		}
		System.out.flush();
		System.exit(rc);
	}
}
