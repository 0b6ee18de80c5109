package retrysim.broker5;

import java.io.FileReader;
import java.io.IOException;
import java.io.InputStream;
import java.lang.management.ManagementFactory;
import java.lang.reflect.InvocationTargetException;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;
import java.util.function.Function;
import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.common.TopicAttributes;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.attribute.TopicMessageType;
import org.apache.rocketmq.common.constant.PermName;
import org.apache.rocketmq.common.consumer.ReceiptHandle;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.remoting.protocol.admin.TopicOffset;
import org.apache.rocketmq.remoting.protocol.subscription.CustomizedRetryPolicy;
import org.apache.rocketmq.remoting.protocol.subscription.GroupRetryPolicy;
import org.apache.rocketmq.remoting.protocol.subscription.GroupRetryPolicyType;
import org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;
import retrysim.harness.Children;
import retrysim.harness.Listener;
import retrysim.harness.Sends;

/**
 * One scenario on a real 5.x namesrv and broker behind the 5.x proxy in local mode, consumed by
 * the official gRPC client (rocketmq-client-java): a push consumer, a push consumer of a FIFO
 * group, or a simple consumer.
 *
 * <p>Args and files as retrysim.broker4.Harness: a properties file and an output folder; the
 * messages (msg_id, queue_id, born_ms) and each delivery's outcome and processing time are CSV
 * files it names; every delivery goes to deliveries.csv, the DLQ's messages to dlq.csv and the
 * store's puts per topic to puts.csv. The namesrv and the proxy in local mode (which hosts the
 * broker) are two child JVMs on loopback (their output in namesrv.log and proxy.log), so that
 * only the clients share this JVM; the topics and groups are made, and the store read back,
 * through the remoting admin API and a pull consumer. The group's retry policy is explicit:
 * CUSTOMIZED, its list the message_delay_level table, retryMaxTimes = max_reconsume_times (so
 * max_reconsume_times + 1 delivery attempts).
 *
 * <p>The gRPC client's classes live in a class loader of their own ({@link Consumers}): the
 * class path, shared with the children, holds the proxy's copy of the protocol's classes. The
 * two sides speak through JDK types only.
 */
public final class Harness {
  private static final String WARM_UP = "retrysim-warm-up";
  private static final String BROKER = "broker-a";
  private static final String CLIENT_JAR = "rocketmq-client-java.jar";
  private static final long MIN_INVISIBLE_MS = 10_000; // the proxy's default, given explicitly
  private static final long START_MS = 30_000; // how long the broker may take to register

  public static void main(String[] args) {
    int status = 1;
    try {
      Properties p = new Properties();
      try (FileReader in = new FileReader(args[0])) {
        p.load(in);
      }
      Path out = Path.of(args[1]);
      Files.createDirectories(out);
      new Harness(p, out).run();
      status = 0;
    } catch (Throwable e) {
      Throwable cause = e instanceof InvocationTargetException ? e.getCause() : e;
      String said = cause.getMessage() == null ? cause.toString() : cause.getMessage();
      System.err.println("retrysim broker5: " + said.lines().findFirst().orElse(said));
    } finally {
      System.exit(status); // the clients' non-daemon threads; the hook stops the children
    }
  }

  /** A delivery as recorded; cells[7], the store time of the copy delivered, comes last. */
  private record Delivery(MessageQueue copy, long offset, String[] cells) {}

  private final Properties p;
  private final Path out;
  private final String topic;
  private final String group;
  private final String kind;
  private final ConcurrentLinkedQueue<Delivery> deliveries = new ConcurrentLinkedQueue<>();
  private Listener listener;
  private volatile long t0 = Long.MAX_VALUE;
  private final Sends sends = new Sends();
  private Children children; // the namesrv and the proxy with its broker
  private Path home; // the children's ROCKETMQ_HOME, their store under it
  private ClassLoader clientLoader;
  private Metrics metrics; // metrics=true: the Prometheus endpoints

  private Harness(Properties p, Path out) {
    this.p = p;
    this.out = out;
    this.topic = p.getProperty("topic");
    this.group = p.getProperty("group");
    this.kind = p.getProperty("consumer", "push");
    check(List.of("push", "push_fifo", "simple").contains(kind),
        "consumer=" + kind + ": push, push_fifo or simple");
  }

  private int integer(String key) {
    return Integer.parseInt(p.getProperty(key));
  }

  private void run() throws Exception {
    listener = new Listener(Path.of(p.getProperty("outcomes")), p.getProperty("outages"));
    check(!kind.equals("simple")
        || Long.parseLong(p.getProperty("invisible_duration_ms", "0")) >= MIN_INVISIBLE_MS,
        "invisible_duration_ms: the proxy takes " + MIN_INVISIBLE_MS + " ms at least");
    children = new Children("broker5", out);
    home = children.home();
    // what the clients keep under the user's home goes to the run's folder (the children's too)
    System.setProperty("user.home", home.toString());
    int namesrvPort = Children.freePort();
    String namesrvAddr = "127.0.0.1:" + namesrvPort;
    children.start("namesrv", "256m", "boot success",
        "org.apache.rocketmq.namesrv.NamesrvStartup", "-c",
        children.write("namesrv.conf", "listenPort=" + namesrvPort, "bindAddress=127.0.0.1",
            "kvConfigPath=" + home.resolve("kvConfig.json")).toString());
    int brokerPort = Children.freeBrokerPort();
    Path store = home.resolve("store");
    Path brokerConf = children.write("broker.conf", "brokerName=" + BROKER,
        "brokerIP1=127.0.0.1", "brokerIP2=127.0.0.1", "bindAddress=127.0.0.1",
        "listenPort=" + brokerPort,
        "haListenPort=" + Children.freePort(), // else listenPort + 1, which may be taken
        "storePathRootDir=" + store, "storePathCommitLog=" + store.resolve("commitlog"),
        "mappedFileSizeCommitLog=" + (64 << 20), "mappedFileSizeConsumeQueue=" + 300_000 * 20,
        "mappedFileSizeTimerLog=" + (16 << 20), "maxHashSlotNum=100000", "maxIndexNum=400000",
        // a send waits up to 3 s in the broker's queue before it is refused as busy
        // (BrokerFastFailure, 200 ms by default): on two cores a pause of the JVMs refused a
        // burst's sends with TIMEOUT_CLEAN_QUEUE
        "waitTimeMillsInSendQueue=3000",
        "messageDelayLevel=" + p.getProperty("message_delay_level"));
    if (Boolean.parseBoolean(p.getProperty("metrics"))) {
      metrics = new Metrics(out, topic, group);
      Files.write(brokerConf, metrics.brokerConfig(), StandardOpenOption.APPEND);
    }
    int grpcPort = Children.freePort();
    // ProxyStartup in local mode builds the broker from broker.conf (BrokerStartup's way)
    children.start("proxy", "512m", "startup successfully",
        "org.apache.rocketmq.proxy.ProxyStartup",
        "-pc", children.write("rmq-proxy.json", "{", "\"proxyMode\": \"LOCAL\",",
            "\"brokerConfigPath\": \"" + brokerConf + "\",",
            "\"namesrvAddr\": \"" + namesrvAddr + "\",",
            "\"localServeAddr\": \"127.0.0.1\",",
            "\"grpcServerPort\": " + grpcPort + ",",
            "\"remotingListenPort\": " + Children.freePort() + ",", // not the fixed 8080
            "\"grpcShutdownTimeSeconds\": 1,",
            "\"minInvisibleTimeMillsForRecv\": " + MIN_INVISIBLE_MS + ",",
            metrics == null ? "" : metrics.proxyConfig(),
            "\"enablePrintJstack\": false", "}").toString());
    p.setProperty("endpoint", "127.0.0.1:" + grpcPort);
    DefaultMQAdminExt admin = new DefaultMQAdminExt();
    admin.setNamesrvAddr(namesrvAddr);
    admin.setInstanceName("retrysim-admin");
    admin.start();
    String brokerAddr = "127.0.0.1:" + brokerPort;
    // the broker's first registration is skipped if its client has not reached the namesrv yet
    // (the next is 10 s later), and the namesrv takes no topic of a broker it does not know:
    // setting the broker's permission (to what it is) registers it at once
    Properties readWrite = new Properties();
    readWrite.setProperty(
        "brokerPermission", String.valueOf(PermName.PERM_READ | PermName.PERM_WRITE));
    long deadline = System.currentTimeMillis() + START_MS;
    while (!admin.examineBrokerClusterInfo().getBrokerAddrTable().containsKey(BROKER)) {
      check(System.currentTimeMillis() < deadline, "the broker did not register with the namesrv");
      admin.updateBrokerConfig(brokerAddr, readWrite);
      Thread.sleep(100);
    }
    System.out.printf("broker5: the namesrv and the proxy with its broker were up %d ms after"
        + " this JVM started%n", uptime());
    if (metrics != null) {
      metrics.writeEndpoints();
    }
    int queues = integer("queues");
    boolean fifo = kind.equals("push_fifo");
    // the broker registers a new topic with the namesrv before it answers
    createTopic(admin, brokerAddr, topic, queues,
        fifo ? TopicMessageType.FIFO : TopicMessageType.NORMAL);
    createGroup(admin, brokerAddr, groupConfig(fifo), topic, queues);
    DefaultMQProducer producer = new DefaultMQProducer(group + "-producer");
    producer.setNamesrvAddr(namesrvAddr);
    producer.start();
    warmUp(admin, brokerAddr, producer, queues);
    AutoCloseable consumers = startConsumers(settings(Map.of()), this::deliver);
    awaitReady(consumers, "the consumers were not ready in 60 s");
    System.out.printf("broker5: consumers ready %d ms after this JVM started%n", uptime());
    Map<String, Long> before = puts(admin, brokerAddr);
    if (metrics != null) {
      metrics.awaitScraper();
    }
    produce(producer, fifo);
    long horizon = Long.parseLong(p.getProperty("horizon_ms"));
    Thread.sleep(Math.max(0, t0 + horizon - System.currentTimeMillis()));
    sends.check();
    consumers.close();
    DefaultMQPullConsumer reader = new DefaultMQPullConsumer(group + "-reader");
    reader.setNamesrvAddr(namesrvAddr);
    reader.start();
    writeDeliveries(reader);
    Map<String, Long> puts = puts(admin, brokerAddr);
    writeDeadLetters(reader, puts.getOrDefault(MixAll.getDLQTopic(group), 0L) > 0);
    writePuts(before, puts);
    reader.shutdown();
    producer.shutdown();
    admin.shutdown();
    children.close();
  }

  private static long uptime() {
    return System.currentTimeMillis() - ManagementFactory.getRuntimeMXBean().getStartTime();
  }

  /** The topic with its queues and message type (a new topic takes added, "+", attributes). */
  private static void createTopic(DefaultMQAdminExt admin, String brokerAddr, String name,
      int queues, TopicMessageType type) throws Exception {
    TopicConfig config =
        new TopicConfig(name, queues, queues, PermName.PERM_READ | PermName.PERM_WRITE);
    config.setAttributes(
        Map.of("+" + TopicAttributes.TOPIC_MESSAGE_TYPE_ATTRIBUTE.getName(), type.getValue()));
    admin.createAndUpdateTopicConfig(brokerAddr, config);
  }

  /** The group, its offsets committed at 0: from the first message, whenever the first pop. */
  private static void createGroup(DefaultMQAdminExt admin, String brokerAddr,
      SubscriptionGroupConfig config, String topic, int queues) throws Exception {
    admin.createAndUpdateSubscriptionGroupConfig(brokerAddr, config);
    for (int queue = 0; queue < queues; queue++) {
      admin.updateConsumeOffset(
          brokerAddr, config.getGroupName(), new MessageQueue(topic, BROKER, queue), 0);
    }
  }

  /**
   * The group: retryMaxTimes = max_reconsume_times and an explicit CUSTOMIZED retry policy whose
   * list is the message_delay_level table. (A new SubscriptionGroupConfig has retryMaxTimes 16
   * and a CUSTOMIZED policy without a list, which means 1s 5s 10s 30s 1m 2m ... 2h.)
   */
  private SubscriptionGroupConfig groupConfig(boolean fifo) {
    SubscriptionGroupConfig config = new SubscriptionGroupConfig();
    config.setGroupName(group);
    config.setRetryMaxTimes(integer("max_reconsume_times"));
    config.setConsumeMessageOrderly(fifo);
    GroupRetryPolicy policy = new GroupRetryPolicy();
    policy.setType(GroupRetryPolicyType.CUSTOMIZED);
    policy.setCustomizedRetryPolicy(
        new CustomizedRetryPolicy(delays(p.getProperty("message_delay_level"))));
    config.setGroupRetryPolicy(policy);
    return config;
  }

  /** "1s 5s 2m 1h" in milliseconds, as the broker reads messageDelayLevel. */
  static long[] delays(String table) {
    String[] levels = table.trim().split("\\s+");
    long[] ms = new long[levels.length];
    for (int i = 0; i < levels.length; i++) {
      String level = levels[i];
      long n = Long.parseLong(level.substring(0, level.length() - 1));
      ms[i] = switch (level.charAt(level.length() - 1)) {
        case 's' -> TimeUnit.SECONDS.toMillis(n);
        case 'm' -> TimeUnit.MINUTES.toMillis(n);
        case 'h' -> TimeUnit.HOURS.toMillis(n);
        case 'd' -> TimeUnit.DAYS.toMillis(n);
        default -> throw new IllegalArgumentException("message_delay_level: " + level);
      };
    }
    return ms;
  }

  /**
   * 2,000 messages, two a millisecond, through a topic and group of their own before the
   * scenario's consumers start, so that its first messages do not pay for the class loading
   * and compilation of the send, pop and ack paths in the three JVMs: the figures are the
   * steady ones. Its puts happen before production, so none is counted.
   */
  private void warmUp(DefaultMQAdminExt admin, String brokerAddr, DefaultMQProducer producer,
      int queues) throws Exception {
    createTopic(admin, brokerAddr, WARM_UP, queues, TopicMessageType.NORMAL);
    SubscriptionGroupConfig config = new SubscriptionGroupConfig();
    config.setGroupName(WARM_UP);
    createGroup(admin, brokerAddr, config, WARM_UP, queues);
    int rounds = 2_000; // C1 compiles a method after 200 calls, C2 after 5,000 (a batch of 32)
    CountDownLatch consumed = new CountDownLatch(rounds);
    AutoCloseable consumer = startConsumers(settings(Map.of("topic", WARM_UP, "group", WARM_UP,
        "consumer", "push", "instances", "1", "await_ms", "1000")),
        delivered -> {
          consumed.countDown();
          return "CONSUME_SUCCESS";
        });
    awaitReady(consumer, "the warm-up consumer was not ready in 60 s");
    for (int i = 0; i < rounds; i++) {
      sends.send(producer, new Message(WARM_UP, "", String.valueOf(i), new byte[] {1}),
          new MessageQueue(WARM_UP, BROKER, i % queues), false);
      if (i % 2 == 1) {
        Listener.sleep(1); // two a millisecond, as a scenario's burst sends
      }
    }
    // Now and then some never come in time (1,893 of 2,000 in one suite's run): most likely
    // a batch popped for a receive the cold client gave up on, invisible then for the proxy's
    // default minute (ProxyConfig.defaultInvisibleTimeMills). Nine in ten consumed and none
    // for 3 s is warm enough (the warm-up's puts are not counted); half is a broken broker.
    long deadline = System.currentTimeMillis() + 60_000;
    long seen = -1;
    long still = System.currentTimeMillis();
    while (consumed.getCount() > 0 && System.currentTimeMillis() < deadline) {
      long left = consumed.getCount();
      if (left != seen) {
        seen = left;
        still = System.currentTimeMillis();
      } else if (left <= rounds / 10 && System.currentTimeMillis() - still > 3_000) {
        break;
      }
      consumed.await(100, TimeUnit.MILLISECONDS);
    }
    long done = rounds - consumed.getCount();
    check(done >= rounds / 2, "the warm-up messages were not consumed in 60 s (" + done + " of "
        + rounds + ")");
    if (done < rounds) {
      System.out.printf("broker5: warm-up: %d of %d consumed; going on%n", done, rounds);
    }
    consumer.close(); // its receives stop; 1 s for its acks to land
  }

  /** The scenario's settings for the client, with some of them replaced. */
  private Map<String, String> settings(Map<String, String> replaced) {
    Map<String, String> settings = new HashMap<>();
    for (String key : p.stringPropertyNames()) {
      settings.put(key, p.getProperty(key));
    }
    settings.putAll(replaced);
    return settings;
  }

  /**
   * Consumers on the gRPC client: its jar, out of the harness's own jar, in a class loader of
   * its own beside the harness's classes (Consumers), made once; the client logs WARN and above,
   * on stdout and under the children's folder.
   */
  private AutoCloseable startConsumers(Map<String, String> settings,
      Function<String[], String> onDelivery) throws Exception {
    if (clientLoader == null) {
      Path jar = home.resolve(CLIENT_JAR);
      try (InputStream in = Harness.class.getResourceAsStream(CLIENT_JAR)) {
        check(in != null, "no " + CLIENT_JAR + " inside the harness's jar");
        Files.copy(in, jar);
      }
      System.setProperty("rocketmq.log.root", home.resolve("client-logs").toString());
      System.setProperty("rocketmq.log.level", "warn");
      System.setProperty("mq.consoleAppender.enabled", "false");
      URL self = Harness.class.getProtectionDomain().getCodeSource().getLocation();
      // never closed: the client's threads load classes to the end (the JVM exits next)
      clientLoader = new URLClassLoader(
          new URL[] {jar.toUri().toURL(), self}, ClassLoader.getPlatformClassLoader());
    }
    Thread thread = Thread.currentThread();
    ClassLoader previous = thread.getContextClassLoader();
    thread.setContextClassLoader(clientLoader);
    try {
      return (AutoCloseable) clientLoader.loadClass("retrysim.broker5.Consumers")
          .getConstructor(Map.class, Function.class).newInstance(settings, onDelivery);
    } finally {
      thread.setContextClassLoader(previous);
    }
  }

  private static void awaitReady(AutoCloseable consumers, String otherwise) throws Exception {
    long deadline = System.currentTimeMillis() + 60_000;
    while (!((BooleanSupplier) consumers).getAsBoolean()) {
      check(System.currentTimeMillis() < deadline, otherwise);
      Thread.sleep(100);
    }
  }

  /**
   * One delivery, on the client's consumption thread: {msg key, deliveryAttempt, receipt handle,
   * instance} in, the scenario's outcome out (after its processing time), the row recorded. The
   * receipt handle says which topic, queue and offset the broker popped it from (%RETRY%... for
   * a retry).
   */
  private String deliver(String[] delivered) {
    long msgId = Long.parseLong(delivered[0]);
    long began = System.nanoTime();
    Listener.Delivery delivery = listener.deliver(msgId, t0);
    if (metrics != null && !kind.equals("simple")) { // as the client: push consumers only
      metrics.processTime(System.nanoTime() - began, delivery.outcome());
    }
    ReceiptHandle handle = ReceiptHandle.decode(delivered[2]);
    String read = handle.getRealTopic(topic, group);
    deliveries.add(new Delivery(new MessageQueue(read, BROKER, handle.getQueueId()),
        handle.getOffset(), new String[] {String.valueOf(msgId), String.valueOf(delivery.number()),
            String.valueOf(Integer.parseInt(delivered[1]) - 1), read,
            String.valueOf(handle.getQueueId()), delivered[3], Thread.currentThread().getName(),
            null, String.valueOf(delivery.startMs()),
            String.valueOf(System.currentTimeMillis() - t0), delivery.outcome()}));
    return delivery.outcome();
  }

  /**
   * Each message to its own queue at its born time, key = msg_id, by the remoting producer (the
   * gRPC producer picks queues itself); on the FIFO topic its message group is its queue id.
   */
  private void produce(DefaultMQProducer producer, boolean fifo) throws Exception {
    List<String> messages = Files.readAllLines(Path.of(p.getProperty("messages")));
    t0 = System.currentTimeMillis();
    Files.writeString(out.resolve("t0-ms.txt"), t0 + "\n");
    for (String line : messages) {
      String[] cells = line.split(",");
      Listener.sleep(t0 + Long.parseLong(cells[2]) - System.currentTimeMillis());
      Message message = new Message(topic, "", cells[0], new byte[] {1});
      if (fifo) {
        MessageAccessor.putProperty(message, MessageConst.PROPERTY_SHARDING_KEY, cells[1]);
      }
      sends.send(producer, message, new MessageQueue(topic, BROKER, Integer.parseInt(cells[1])),
          fifo);
    }
  }

  /** Up to 32 messages of a queue from an offset on, as the broker stored them. */
  private static List<MessageExt> pull(DefaultMQPullConsumer reader, MessageQueue queue,
      long offset) throws Exception {
    PullResult pulled = reader.pull(queue, "*", offset, 32);
    return pulled.getPullStatus() == PullStatus.FOUND ? pulled.getMsgFoundList() : List.of();
  }

  /**
   * Every delivery, with when the copy it delivered was stored (a retry: the reviver's copy,
   * when it became Ready), read back from the broker by its queue and offset.
   */
  private void writeDeliveries(DefaultMQPullConsumer reader) throws Exception {
    Map<String, Long> stored = new HashMap<>(); // by queue and offset
    List<String> rows = new ArrayList<>();
    for (Delivery delivery : deliveries) {
      String at = delivery.copy() + " offset " + delivery.offset();
      if (!stored.containsKey(at)) {
        for (MessageExt msg : pull(reader, delivery.copy(), delivery.offset())) {
          stored.put(delivery.copy() + " offset " + msg.getQueueOffset(), msg.getStoreTimestamp());
        }
      }
      check(stored.containsKey(at), "the broker has no message at " + at);
      delivery.cells()[7] = String.valueOf(stored.get(at) - t0);
      rows.add(String.join(",", delivery.cells()));
    }
    Files.write(out.resolve("deliveries.csv"), rows);
  }

  /** %DLQ%<group>'s messages (its one queue), if it has any (else it has no route). */
  private void writeDeadLetters(DefaultMQPullConsumer reader, boolean any) throws Exception {
    List<String> rows = new ArrayList<>();
    MessageQueue dlq = new MessageQueue(MixAll.getDLQTopic(group), BROKER, 0);
    // one row per message, so the rows so far are the next offset
    for (List<MessageExt> batch; any && !(batch = pull(reader, dlq, rows.size())).isEmpty(); ) {
      for (MessageExt msg : batch) {
        rows.add(msg.getKeys() + "," + (msg.getStoreTimestamp() - t0));
      }
    }
    Files.write(out.resolve("dlq.csv"), rows);
  }

  /**
   * The store's puts per topic so far, the pop's bookkeeping in rmq_sys_* topics included: each
   * put is one entry of a consume queue, so the sum of the topic's queues' max offsets.
   */
  private static Map<String, Long> puts(DefaultMQAdminExt admin, String brokerAddr)
      throws Exception {
    Map<String, Long> puts = new TreeMap<>();
    for (String name : admin.getAllTopicConfig(brokerAddr, 10_000).getTopicConfigTable()
        .keySet()) {
      long count = 0;
      for (TopicOffset queue : admin.examineTopicStats(brokerAddr, name).getOffsetTable()
          .values()) {
        count += queue.getMaxOffset();
      }
      puts.put(name, count);
    }
    return puts;
  }

  /** The puts from production on: the warm-up's (its topic, its pops' bookkeeping) are not. */
  private void writePuts(Map<String, Long> before, Map<String, Long> after) throws IOException {
    List<String> rows = new ArrayList<>();
    after.forEach((name, count) -> {
      long since = count - before.getOrDefault(name, 0L);
      if (since > 0 && !name.contains(WARM_UP)) {
        rows.add(name + "," + since);
      }
    });
    Files.write(out.resolve("puts.csv"), rows);
  }

  private static void check(boolean ok, String what) {
    if (!ok) {
      throw new IllegalStateException(what);
    }
  }
}
