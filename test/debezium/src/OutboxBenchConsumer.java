/*
 * OutboxBenchConsumer: the Debezium comparison's one Kafka reader, written
 * with Kafka's own Java client (benchmark tool only, never installed).  The
 * relay's messages and Debezium's are read by this same code.
 *
 *   topics BOOTSTRAP PARTITIONS TOPIC...  create the topics (replication 3)
 *                                  unless they exist
 *   count BOOTSTRAP TOPIC           the sum of the topic's end offsets
 *   watch BOOTSTRAP TOPIC TARGET SECONDS
 *                                  from now on, one line "EPOCH_MS COUNT"
 *                                  whenever the number of messages written
 *                                  since the start changes (end offsets,
 *                                  checked every 10 ms); ends when COUNT
 *                                  reaches TARGET or after SECONDS
 *   latency BOOTSTRAP TOPIC SECONDS  read from the end, with a 5 ms fetch
 *                                  wait, for SECONDS; one line per message:
 *                                  arrival minus the payload's "t"
 *                                  (microseconds since 1970), in ms.
 *                                  "ready" goes to stderr once positioned
 */

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.*;
import java.util.concurrent.TimeUnit;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.apache.kafka.clients.admin.*;
import org.apache.kafka.clients.consumer.*;
import org.apache.kafka.common.*;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class OutboxBenchConsumer
{
	static final Pattern T_FIELD = Pattern.compile("\"t\"\\s*:\\s*(\\d+)");

	static KafkaConsumer<byte[], byte[]> consumer(String boot, boolean quick)
	{
		Properties p = new Properties();
		p.put("bootstrap.servers", boot);
		p.put("enable.auto.commit", "false");
		p.put("default.api.timeout.ms", "20000");
		if (quick)
		{
			p.put("fetch.max.wait.ms", "5");
			p.put("fetch.min.bytes", "1");
		}
		return new KafkaConsumer<>(p, new ByteArrayDeserializer(), new ByteArrayDeserializer());
	}

	static List<TopicPartition> partitions(KafkaConsumer<byte[], byte[]> c, String topic) throws Exception
	{
		long deadline = System.currentTimeMillis() + 30000;
		while (true)
		{
			List<PartitionInfo> infos = c.partitionsFor(topic, Duration.ofSeconds(10));
			if (infos != null && !infos.isEmpty())
			{
				List<TopicPartition> tps = new ArrayList<>();
				for (PartitionInfo pi : infos)
					tps.add(new TopicPartition(topic, pi.partition()));
				return tps;
			}
			if (System.currentTimeMillis() > deadline)
				throw new RuntimeException("topic " + topic + " does not exist");
			Thread.sleep(200);
		}
	}

	static long sum(Map<TopicPartition, Long> m)
	{
		long s = 0;
		for (long v : m.values())
			s += v;
		return s;
	}

	static int topics(String boot, int parts, String[] names) throws Exception
	{
		Properties p = new Properties();
		p.put("bootstrap.servers", boot);
		try (Admin admin = Admin.create(p))
		{
			Set<String> have = admin.listTopics().names().get(20, TimeUnit.SECONDS);
			List<NewTopic> want = new ArrayList<>();
			for (String n : names)
				if (!have.contains(n))
					want.add(new NewTopic(n, parts, (short) 3));
			admin.createTopics(want).all().get(30, TimeUnit.SECONDS);
		}
		return 0;
	}

	static int watch(String boot, String topic, long target, int seconds) throws Exception
	{
		try (KafkaConsumer<byte[], byte[]> c = consumer(boot, false))
		{
			List<TopicPartition> tps = partitions(c, topic);
			long start = sum(c.endOffsets(tps));
			long last = -1;
			long deadline = System.currentTimeMillis() + seconds * 1000L;
			while (System.currentTimeMillis() < deadline)
			{
				long n = sum(c.endOffsets(tps)) - start;
				if (n != last)
				{
					System.out.println(System.currentTimeMillis() + " " + n);
					System.out.flush();
					last = n;
				}
				if (n >= target)
					break;
				Thread.sleep(10);
			}
		}
		return 0;
	}

	static int latency(String boot, String topic, int seconds) throws Exception
	{
		StringBuilder out = new StringBuilder();
		try (KafkaConsumer<byte[], byte[]> c = consumer(boot, true))
		{
			List<TopicPartition> tps = partitions(c, topic);
			c.assign(tps);
			c.seekToEnd(tps);
			for (TopicPartition tp : tps)
				c.position(tp);
			System.err.println("ready");
			long deadline = System.currentTimeMillis() + seconds * 1000L;
			while (System.currentTimeMillis() < deadline)
			{
				ConsumerRecords<byte[], byte[]> rs = c.poll(Duration.ofMillis(100));
				long now = System.currentTimeMillis();
				double nowUs = now * 1000.0;
				for (ConsumerRecord<byte[], byte[]> r : rs)
				{
					if (r.value() == null)
						continue;
					Matcher m = T_FIELD.matcher(new String(r.value(), StandardCharsets.UTF_8));
					if (m.find())
						out.append(String.format("%.3f%n", (nowUs - Long.parseLong(m.group(1))) / 1000.0));
				}
			}
		}
		System.out.print(out);
		System.out.flush();
		return 0;
	}

	public static void main(String[] args) throws Exception
	{
		int rc;

		switch (args.length > 0 ? args[0] : "")
		{
			case "topics":
				rc = topics(args[1], Integer.parseInt(args[2]), Arrays.copyOfRange(args, 3, args.length));
				break;
			case "count":
				try (KafkaConsumer<byte[], byte[]> c = consumer(args[1], false))
				{
					System.out.println(sum(c.endOffsets(partitions(c, args[2]))));
				}
				rc = 0;
				break;
			case "watch":
				rc = watch(args[1], args[2], Long.parseLong(args[3]), Integer.parseInt(args[4]));
				break;
			case "latency":
				rc = latency(args[1], args[2], Integer.parseInt(args[3]));
				break;
			default:
				System.err.println("usage: OutboxBenchConsumer topics|count|watch|latency ...");
				rc = 2;
		}
		System.exit(rc);
	}
}
