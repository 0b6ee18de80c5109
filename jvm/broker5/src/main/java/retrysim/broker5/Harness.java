package retrysim.broker5;

import java.io.FileReader;
import java.io.IOException;
import java.io.InputStream;
import java.io.PrintWriter;
import java.lang.reflect.InvocationTargetException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.net.ServerSocket;
import java.net.URL;
import java.net.URLClassLoader;
import java.nio.ByteBuffer;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Deque;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.function.BooleanSupplier;
import java.util.function.Function;
import org.apache.rocketmq.auth.config.AuthConfig;
import org.apache.rocketmq.broker.BrokerController;
import org.apache.rocketmq.broker.processor.PopReviveService;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.common.TopicAttributes;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.attribute.TopicMessageType;
import org.apache.rocketmq.common.constant.PermName;
import org.apache.rocketmq.common.consumer.ReceiptHandle;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageAccessor;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageDecoder;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.namesrv.NamesrvConfig;
import org.apache.rocketmq.namesrv.NamesrvController;
import org.apache.rocketmq.proxy.ProxyStartup;
import org.apache.rocketmq.proxy.config.Configuration;
import org.apache.rocketmq.proxy.config.ConfigurationManager;
import org.apache.rocketmq.proxy.grpc.GrpcServer;
import org.apache.rocketmq.proxy.grpc.GrpcServerBuilder;
import org.apache.rocketmq.proxy.grpc.v2.GrpcMessagingApplication;
import org.apache.rocketmq.proxy.metrics.ProxyMetricsManager;
import org.apache.rocketmq.proxy.processor.DefaultMessagingProcessor;
import org.apache.rocketmq.proxy.processor.MessagingProcessor;
import org.apache.rocketmq.proxy.service.cert.TlsCertificateManager;
import org.apache.rocketmq.remoting.netty.NettyClientConfig;
import org.apache.rocketmq.remoting.netty.NettyServerConfig;
import org.apache.rocketmq.remoting.protocol.subscription.CustomizedRetryPolicy;
import org.apache.rocketmq.remoting.protocol.subscription.GroupRetryPolicy;
import org.apache.rocketmq.remoting.protocol.subscription.GroupRetryPolicyType;
import org.apache.rocketmq.remoting.protocol.subscription.SubscriptionGroupConfig;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.GetMessageResult;
import org.apache.rocketmq.store.MessageStore;
import org.apache.rocketmq.store.config.MessageStoreConfig;

/**
 * One scenario on a real 5.x namesrv and broker behind the 5.x proxy in local mode, consumed by
 * the official gRPC client (rocketmq-client-java): a push consumer, a push consumer of a FIFO
 * group, or a simple consumer.
 *
 * <p>Args and files as retrysim.broker4.Harness: a properties file and an output folder; the
 * messages (msg_id, queue_id, born_ms) and each delivery's outcome and processing time are CSV
 * files it names; every delivery goes to deliveries.csv, the DLQ's messages to dlq.csv and the
 * store's puts per topic to puts.csv. The group's retry policy is explicit: CUSTOMIZED, its list
 * the message_delay_level table, retryMaxTimes = max_reconsume_times (so max_reconsume_times + 1
 * delivery attempts).
 *
 * <p>The client's classes live in a class loader of their own ({@link Consumers}); the two sides
 * speak through JDK types only.
 */
public final class Harness {
  private static final String BROKER = "broker-a";
  private static final String CLIENT_JAR = "rocketmq-client-java.jar";

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
      System.exit(status); // the clients', the proxy's and the broker's non-daemon threads
    }
  }

  private final Properties p;
  private final Path out;
  private final String topic;
  private final String group;
  private final String kind;
  private final ConcurrentLinkedQueue<String> deliveries = new ConcurrentLinkedQueue<>();
  private final Map<Long, AtomicInteger> seen = new ConcurrentHashMap<>();
  private final Map<String, String[]> outcomes = new HashMap<>();
  private final Deque<AutoCloseable> running = new ArrayDeque<>(); // stopped in reverse
  private volatile long t0 = Long.MAX_VALUE;
  private volatile MessageStore messageStore; // each delivered copy's store time

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

  private static int freePort() throws IOException {
    try (ServerSocket socket = new ServerSocket(0, 50, InetAddress.getLoopbackAddress())) {
      return socket.getLocalPort();
    }
  }

  /** A free port whose port - 2 is free too: the broker's fast (VIP) server listens there. */
  private static int freeBrokerPort() throws IOException {
    for (int tries = 0; ; tries++) {
      int port = freePort();
      try (ServerSocket vip = new ServerSocket()) {
        vip.bind(new InetSocketAddress("127.0.0.1", port - 2));
        return port;
      } catch (IOException taken) {
        if (tries == 20) {
          throw taken;
        }
      }
    }
  }

  private void run() throws Exception {
    for (String line : Files.readAllLines(Path.of(p.getProperty("outcomes")))) {
      String[] cells = line.split(",");
      outcomes.put(cells[0] + "/" + cells[1], cells);
    }
    Path store = Files.createTempDirectory("retrysim-broker5-");
    // what the broker and its RocksDB logs keep under the user's home goes to the store too
    System.setProperty("user.home", store.toString());
    try {
      run(store);
    } finally {
      while (!running.isEmpty()) {
        try {
          running.pop().close();
        } catch (Exception ignored) {
          // stopping on the way out: the first failure is the one reported
        }
      }
      deleteTree(store);
    }
  }

  private void run(Path store) throws Exception {
    long began = System.currentTimeMillis();
    String namesrvAddr = startNamesrv(store);
    BrokerController broker = startBrokerAndProxy(store, namesrvAddr);
    messageStore = broker.getMessageStore();
    int queues = integer("queues");
    boolean fifo = kind.equals("push_fifo");
    TopicConfig topicConfig =
        new TopicConfig(topic, queues, queues, PermName.PERM_READ | PermName.PERM_WRITE);
    // a new topic takes added ("+") attributes only
    String type = (fifo ? TopicMessageType.FIFO : TopicMessageType.NORMAL).getValue();
    topicConfig.setAttributes(
        new HashMap<>(Map.of("+" + TopicAttributes.TOPIC_MESSAGE_TYPE_ATTRIBUTE.getName(), type)));
    broker.getTopicConfigManager().updateTopicConfig(topicConfig);
    broker.getSubscriptionGroupManager().updateSubscriptionGroupConfig(groupConfig(fifo));
    for (int queue = 0; queue < queues; queue++) { // from the first message, whenever the first pop
      broker.getConsumerOffsetManager().commitOffset("retrysim", group, topic, queue, 0);
    }
    broker.registerBrokerAll(true, false, true);
    System.out.println("broker5: namesrv, broker and proxy up in "
        + (System.currentTimeMillis() - began) + " ms");

    DefaultMQProducer producer = new DefaultMQProducer(group + "-producer");
    producer.setNamesrvAddr(namesrvAddr);
    producer.start();
    running.push(producer::shutdown);
    Object consumers = startConsumers(store, queues);
    BooleanSupplier ready = (BooleanSupplier) consumers;
    long deadline = System.currentTimeMillis() + 60_000;
    while (!ready.getAsBoolean()) {
      check(System.currentTimeMillis() < deadline, "the consumers were not ready in 60 s");
      Thread.sleep(100);
    }
    System.out.println("broker5: consumers ready "
        + (System.currentTimeMillis() - began) + " ms after the start");
    produce(producer, fifo);
    long horizon = Long.parseLong(p.getProperty("horizon_ms"));
    Thread.sleep(Math.max(0, t0 + horizon - System.currentTimeMillis()));
    running.remove(consumers);
    ((AutoCloseable) consumers).close();
    Files.write(out.resolve("deliveries.csv"), deliveries);
    writeDeadLetters(broker.getMessageStore());
    writePuts((DefaultMessageStore) broker.getMessageStore());
  }

  private String startNamesrv(Path store) throws Exception {
    NamesrvConfig config = new NamesrvConfig();
    config.setKvConfigPath(store.resolve("namesrv/kvConfig.json").toString());
    config.setConfigStorePath(store.resolve("namesrv/namesrv.properties").toString());
    NettyServerConfig netty = new NettyServerConfig();
    netty.setBindAddress("127.0.0.1");
    netty.setListenPort(freePort());
    NamesrvController namesrv = new NamesrvController(config, netty, new NettyClientConfig());
    check(namesrv.initialize(), "the namesrv did not initialize");
    namesrv.start();
    running.push(namesrv::shutdown);
    return "127.0.0.1:" + netty.getListenPort();
  }

  /** The broker and, in front of it, the proxy in local mode, as ProxyStartup builds them. */
  private BrokerController startBrokerAndProxy(Path store, String namesrvAddr) throws Exception {
    BrokerConfig brokerConfig = new BrokerConfig();
    brokerConfig.setBrokerName(BROKER);
    brokerConfig.setBrokerIP1("127.0.0.1");
    brokerConfig.setBrokerIP2("127.0.0.1");
    brokerConfig.setNamesrvAddr(namesrvAddr);
    NettyServerConfig netty = new NettyServerConfig();
    netty.setBindAddress("127.0.0.1");
    netty.setListenPort(freeBrokerPort());
    brokerConfig.setListenPort(netty.getListenPort());
    MessageStoreConfig storeConfig = new MessageStoreConfig();
    Path root = store.resolve("broker");
    storeConfig.setStorePathRootDir(root.toString());
    storeConfig.setStorePathCommitLog(root.resolve("commitlog").toString());
    storeConfig.setMappedFileSizeCommitLog(64 << 20);
    storeConfig.setMappedFileSizeConsumeQueue(300_000 * 20);
    storeConfig.setMappedFileSizeTimerLog(16 << 20);
    storeConfig.setMaxHashSlotNum(100_000);
    storeConfig.setMaxIndexNum(400_000);
    storeConfig.setMessageDelayLevel(p.getProperty("message_delay_level"));
    storeConfig.setHaListenPort(freePort()); // not the fixed 10912: runs side by side
    AuthConfig authConfig = new AuthConfig();
    authConfig.setConfigName(BROKER);
    authConfig.setClusterName(brokerConfig.getBrokerClusterName());
    authConfig.setAuthConfigPath(root.resolve("config").toString());
    BrokerController broker =
        new BrokerController(brokerConfig, netty, new NettyClientConfig(), storeConfig, authConfig);
    check(broker.initialize(), "the broker did not initialize (store " + root + ")");

    int grpcPort = freePort();
    Path proxyJson = store.resolve("rmq-proxy.json");
    Files.writeString(proxyJson, String.join("\n", "{",
        "\"proxyMode\": \"LOCAL\",",
        "\"rocketMQClusterName\": \"" + brokerConfig.getBrokerClusterName() + "\",",
        "\"namesrvAddr\": \"" + namesrvAddr + "\",",
        "\"localServeAddr\": \"127.0.0.1\",",
        "\"grpcServerPort\": " + grpcPort + ",",
        "\"grpcShutdownTimeSeconds\": 1,",
        "\"enablePrintJstack\": false",
        "}"));
    System.setProperty(ConfigurationManager.RMQ_PROXY_HOME, store.toString());
    System.setProperty(Configuration.CONFIG_PATH_PROPERTY, proxyJson.toString());
    ConfigurationManager.initEnv();
    ConfigurationManager.initConfig();
    long minInvisible = ConfigurationManager.getProxyConfig().getMinInvisibleTimeMillsForRecv();
    check(!kind.equals("simple")
        || Long.parseLong(p.getProperty("invisible_duration_ms", "0")) >= minInvisible,
        "invisible_duration_ms: the proxy takes " + minInvisible + " ms at least");
    ProxyMetricsManager.initLocalMode(
        broker.getBrokerMetricsManager(), ConfigurationManager.getProxyConfig());
    MessagingProcessor processor = DefaultMessagingProcessor.createForLocalMode(broker);
    TlsCertificateManager tls = new TlsCertificateManager();
    GrpcMessagingApplication application = GrpcMessagingApplication.create(processor);
    GrpcServer grpc = GrpcServerBuilder
        .newBuilder(ProxyStartup.createServerExecutor(), grpcPort, tls)
        .addService(application)
        .configInterceptor()
        .shutdownTime(1, TimeUnit.SECONDS)
        .build();
    broker.start();
    running.push(() -> {
      // the broker joins its 8 revive threads one by one, each up to 4 s into a scan: stop them
      // all at once first
      for (PopReviveService revive : broker.getAckMessageProcessor().getPopReviveServices()) {
        revive.makeStop();
        revive.wakeup();
      }
      broker.shutdown();
    });
    processor.start();
    running.push(processor::shutdown);
    tls.start();
    running.push(tls::shutdown);
    application.start();
    running.push(application::shutdown);
    grpc.start();
    running.push(grpc::shutdown);
    p.setProperty("endpoint", "127.0.0.1:" + grpcPort);
    return broker;
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
   * The client's jar, out of the harness's own jar, in a class loader of its own beside the
   * harness's classes (Consumers); the client logs WARN and above, on stdout and under the store.
   */
  private Object startConsumers(Path store, int queues) throws Exception {
    Path jar = store.resolve(CLIENT_JAR);
    try (InputStream in = Harness.class.getResourceAsStream(CLIENT_JAR)) {
      check(in != null, "no " + CLIENT_JAR + " inside the harness's jar");
      Files.copy(in, jar);
    }
    System.setProperty("rocketmq.log.root", store.resolve("client-logs").toString());
    System.setProperty("rocketmq.log.level", "warn");
    System.setProperty("mq.consoleAppender.enabled", "false");
    URL self = Harness.class.getProtectionDomain().getCodeSource().getLocation();
    URLClassLoader loader = new URLClassLoader(
        new URL[] {jar.toUri().toURL(), self}, ClassLoader.getPlatformClassLoader());
    // never closed: the client's threads load classes to the end (the JVM exits next)
    Map<String, String> settings = new HashMap<>();
    for (String key : p.stringPropertyNames()) {
      settings.put(key, p.getProperty(key));
    }
    Function<String[], String> listener = this::deliver;
    Thread thread = Thread.currentThread();
    ClassLoader previous = thread.getContextClassLoader();
    thread.setContextClassLoader(loader);
    try {
      Object consumers = loader.loadClass("retrysim.broker5.Consumers")
          .getConstructor(Map.class, Function.class).newInstance(settings, listener);
      running.push((AutoCloseable) consumers);
      return consumers;
    } finally {
      thread.setContextClassLoader(previous);
    }
  }

  /**
   * One delivery, on the client's consumption thread: {msg key, deliveryAttempt, receipt handle,
   * instance} in, the scenario's outcome out (after its processing time), the row recorded. The
   * receipt handle says which topic and queue the broker popped it from (%RETRY%... for a retry).
   */
  private String deliver(String[] delivered) {
    long msgId = Long.parseLong(delivered[0]);
    int delivery = seen.computeIfAbsent(msgId, id -> new AtomicInteger()).incrementAndGet();
    String[] outcome = outcomes.get(msgId + "/" + delivery);
    String result = outcome == null ? "CONSUME_SUCCESS" : outcome[2];
    long processing = outcome == null ? 0 : Long.parseLong(outcome[3]);
    long start = System.currentTimeMillis() - t0;
    sleep(processing);
    ReceiptHandle handle = ReceiptHandle.decode(delivered[2]);
    String read = handle.getRealTopic(topic, group);
    // when the copy delivered was stored (a retry: the reviver's copy): when it became Ready
    long stored = messageStore.getMessageStoreTimeStamp(read, handle.getQueueId(),
        handle.getOffset()) - t0;
    deliveries.add(String.join(",", String.valueOf(msgId), String.valueOf(delivery),
        String.valueOf(Integer.parseInt(delivered[1]) - 1), read,
        String.valueOf(handle.getQueueId()), delivered[3], Thread.currentThread().getName(),
        String.valueOf(stored), String.valueOf(start),
        String.valueOf(System.currentTimeMillis() - t0), result));
    return result;
  }

  private static void sleep(long ms) {
    if (ms <= 0) {
      return;
    }
    try {
      Thread.sleep(ms);
    } catch (InterruptedException e) {
      Thread.currentThread().interrupt();
    }
  }

  /**
   * Each message to its own queue at its born time, key = msg_id, by the remoting producer (the
   * gRPC producer picks queues itself); on the FIFO topic its message group is its queue id.
   */
  private void produce(DefaultMQProducer producer, boolean fifo) throws Exception {
    List<String> messages = Files.readAllLines(Path.of(p.getProperty("messages")));
    t0 = System.currentTimeMillis();
    for (String line : messages) {
      String[] cells = line.split(",");
      sleep(t0 + Long.parseLong(cells[2]) - System.currentTimeMillis());
      Message message = new Message(topic, "", cells[0], new byte[] {1});
      if (fifo) {
        MessageAccessor.putProperty(message, MessageConst.PROPERTY_SHARDING_KEY, cells[1]);
      }
      producer.send(message, new MessageQueue(topic, BROKER, Integer.parseInt(cells[1])));
    }
  }

  /** %DLQ%<group>, read from the store itself. */
  private void writeDeadLetters(MessageStore store) throws IOException {
    List<String> rows = new ArrayList<>();
    String dlq = MixAll.getDLQTopic(group);
    for (long offset = 0; ; ) {
      GetMessageResult result = store.getMessage(group + "-dlq-reader", dlq, 0, offset, 32, null);
      if (result == null || result.getMessageBufferList().isEmpty()) {
        break;
      }
      for (ByteBuffer buffer : result.getMessageBufferList()) {
        MessageExt msg = MessageDecoder.decode(buffer);
        rows.add(msg.getKeys() + "," + (msg.getStoreTimestamp() - t0));
      }
      offset = result.getNextBeginOffset();
      result.release();
    }
    Files.write(out.resolve("dlq.csv"), rows);
  }

  private void writePuts(DefaultMessageStore store) throws IOException {
    try (PrintWriter puts = new PrintWriter(Files.newBufferedWriter(out.resolve("puts.csv")))) {
      store.getStoreStatsService().getPutMessageTopicTimesTotal()
          .forEach((name, count) -> puts.println(name + "," + count.sum()));
    }
  }

  private static void deleteTree(Path root) throws IOException {
    try (var paths = Files.walk(root)) {
      for (Path path : paths.sorted(java.util.Comparator.reverseOrder()).toList()) {
        Files.deleteIfExists(path);
      }
    }
  }

  private static void check(boolean ok, String what) {
    if (!ok) {
      throw new IllegalStateException(what);
    }
  }
}
