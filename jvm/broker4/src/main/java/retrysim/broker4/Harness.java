package retrysim.broker4;

import java.io.FileReader;
import java.io.InputStream;
import java.lang.management.ManagementFactory;
import java.lang.reflect.Field;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeSet;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.Delayed;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.TimeUnit;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.ConsumeOrderlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.consumer.listener.MessageListenerOrderly;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.admin.TopicOffset;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;
import org.apache.rocketmq.common.topic.TopicValidator;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;
import retrysim.harness.Children;
import retrysim.harness.Listener;
import retrysim.harness.Sends;

/**
 * One scenario on a real 4.9.7 namesrv and broker, consumed by the official push consumer.
 *
 * <p>Args: a properties file (written by retrysim.conformance) and an output folder. The
 * messages (msg_id, queue_id, born_ms) and each delivery's outcome and processing time (by
 * msg_id and delivery number, drawn by retrysim) are CSV files it names. The namesrv and the
 * broker are two child JVMs on loopback (their output in namesrv.log and broker.log), so that
 * only the clients share this JVM; the topic is made and the store's counts read through the
 * admin API. Production starts once every consumer holds its queues; every delivery is
 * written to deliveries.csv, the DLQ's messages to dlq.csv and the store's puts per topic to
 * puts.csv. With {@code metrics=true} it also serves the RocketMQ exporter's series, emulated
 * ({@link Exporter}), its URL in metrics-endpoints.txt.
 */
public final class Harness {
  private static final String GROUP_KEY = "group";
  private static final String WARM_UP = "retrysim-warm-up";
  private static final String BROKER = "broker-a";

  public static void main(String[] args) throws Exception {
    Properties p = new Properties();
    try (FileReader in = new FileReader(args[0])) {
      p.load(in);
    }
    Path out = Path.of(args[1]);
    Files.createDirectories(out);
    int status = 1;
    try {
      new Harness(p, out).run();
      status = 0;
    } catch (Exception e) {
      System.err.println("retrysim broker4: " + e.getMessage());
    } finally {
      System.exit(status); // the clients' non-daemon threads; the hook stops the children
    }
  }

  private final Properties p;
  private final Path out;
  private final String topic;
  private final String group;
  private final String model; // concurrently, orderly or broadcasting
  private final ConcurrentLinkedQueue<String> deliveries = new ConcurrentLinkedQueue<>();
  private Listener listener;
  private volatile long t0 = Long.MAX_VALUE;
  private final Sends sends = new Sends();
  private Children children; // the namesrv and the broker

  private Harness(Properties p, Path out) {
    this.p = p;
    this.out = out;
    this.topic = p.getProperty("topic");
    this.group = p.getProperty(GROUP_KEY);
    this.model = p.getProperty("model", "concurrently");
  }

  private int integer(String key) {
    return Integer.parseInt(p.getProperty(key));
  }

  private void run() throws Exception {
    listener = new Listener(Path.of(p.getProperty("outcomes")), p.getProperty("outages"));
    children = new Children("broker4", out);
    Path home = children.home();
    // a broadcasting consumer keeps its offsets in a local file: in the run's folder
    System.setProperty("rocketmq.client.localOffsetStoreDir", home.resolve("offsets").toString());
    Files.createDirectories(home.resolve("conf"));
    for (String name : new String[] {"namesrv", "broker"}) { // the official mains read these
      try (InputStream config = Harness.class.getResourceAsStream("/logback.xml")) {
        Files.copy(config, home.resolve("conf/logback_" + name + ".xml"));
      }
    }
    int namesrvPort = Children.freePort();
    String namesrvAddr = "127.0.0.1:" + namesrvPort;
    start("namesrv", "256m", "org.apache.rocketmq.namesrv.NamesrvStartup",
        "listenPort=" + namesrvPort, "kvConfigPath=" + home.resolve("kvConfig.json"));
    int brokerPort = Children.freeBrokerPort();
    Path store = home.resolve("store");
    start("broker", "512m", "org.apache.rocketmq.broker.BrokerStartup",
        "brokerName=" + BROKER, "brokerIP1=127.0.0.1", "namesrvAddr=" + namesrvAddr,
        "listenPort=" + brokerPort, "storePathRootDir=" + store,
        "storePathCommitLog=" + store.resolve("commitlog"),
        "mappedFileSizeCommitLog=" + (64 << 20), "mappedFileSizeConsumeQueue=" + 300_000 * 20,
        "waitTimeMillsInSendQueue=3000", // as broker5's: a JVM's pause is no refused send
        "messageDelayLevel=" + p.getProperty("message_delay_level"));
    System.out.printf("broker4: the namesrv and the broker were up %d ms after this JVM started%n",
        System.currentTimeMillis() - ManagementFactory.getRuntimeMXBean().getStartTime());
    DefaultMQAdminExt admin = new DefaultMQAdminExt();
    admin.setNamesrvAddr(namesrvAddr);
    admin.setInstanceName("retrysim-admin");
    admin.start();
    // the RocketMQ exporter's series, emulated, served from here on (a property asks for them)
    Exporter exporter = Boolean.parseBoolean(p.getProperty("metrics", "false"))
        ? new Exporter(namesrvAddr, out.resolve("metrics-endpoints.txt")) : null;
    String brokerAddr = "127.0.0.1:" + brokerPort;
    int queues = integer("queues");
    // the broker registers the topic with the namesrv before it answers
    admin.createAndUpdateTopicConfig(brokerAddr, new TopicConfig(topic, queues, queues, 6));

    List<DefaultMQPushConsumer> consumers = new ArrayList<>();
    for (int i = 0; i < integer("instances"); i++) {
      consumers.add(consumer(namesrvAddr, i));
    }
    DefaultMQProducer producer = new DefaultMQProducer(group + "-producer");
    producer.setNamesrvAddr(namesrvAddr);
    producer.start();
    waitForRebalance(consumers, queues);
    warmUp(admin, brokerAddr, namesrvAddr, producer, queues);
    if (exporter != null) { // a scraper sees the run from t0: production waits for it
      awaitScraper();
    }
    produce(producer, queues, consumers.get(0));
    long horizon = Long.parseLong(p.getProperty("horizon_ms"));
    Thread.sleep(Math.max(0, t0 + horizon - System.currentTimeMillis()));
    sends.check();
    for (DefaultMQPushConsumer consumer : consumers) {
      consumer.shutdown();
    }
    producer.shutdown();
    Files.write(out.resolve("deliveries.csv"), deliveries);
    writeDeadLetters(namesrvAddr);
    writePuts(admin);
    if (exporter != null) { // served a little longer, so that a scrape sees the end
      Listener.sleep(Long.parseLong(p.getProperty("metrics_linger_ms", "0")));
      exporter.close();
    }
    admin.shutdown();
    children.close();
  }

  /**
   * A child JVM running {@code main} with a properties file of {@code settings} as its -c;
   * back once it says it booted.
   */
  private void start(String name, String heap, String main, String... settings)
      throws Exception {
    Path config = children.write(name + ".conf", settings);
    children.start(name, heap, "boot success", main, "-c", config.toString());
  }

  private DefaultMQPushConsumer consumer(String namesrvAddr, int instance) throws Exception {
    DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(group);
    consumer.setNamesrvAddr(namesrvAddr);
    // the client ids sort as retrysim numbers its instances (allocation follows the sort)
    consumer.setInstanceName(String.format("instance-%03d", instance));
    consumer.setConsumeThreadMin(integer("threads"));
    consumer.setConsumeThreadMax(integer("threads"));
    consumer.setMaxReconsumeTimes(integer("max_reconsume_times"));
    consumer.setConsumeTimeout(Long.parseLong(p.getProperty("consume_timeout_minutes")));
    consumer.setPullThresholdForQueue(integer("pull_threshold_for_queue"));
    // at the horizon, the listeners still running finish and are recorded (retrysim counts a
    // delivery from its start)
    consumer.setAwaitTerminationMillisWhenShutdown(Long.parseLong(p.getProperty("await_ms")));
    consumer.subscribe(topic, "*");
    switch (model) {
      case "orderly" -> {
        long suspend = Long.parseLong(p.getProperty("suspend_ms"));
        consumer.registerMessageListener((MessageListenerOrderly) (msgs, context) -> {
          context.setSuspendCurrentQueueTimeMillis(suspend);
          return switch (listen(msgs.get(0), instance)) {
            case "CONSUME_SUCCESS" -> ConsumeOrderlyStatus.SUCCESS;
            case "EXCEPTION" -> throw new IllegalStateException("the scenario's listener throws");
            case "NULL_RETURN" -> null;
            default -> ConsumeOrderlyStatus.SUSPEND_CURRENT_QUEUE_A_MOMENT;
          };
        });
      }
      default -> {
        if (model.equals("broadcasting")) {
          consumer.setMessageModel(MessageModel.BROADCASTING);
        }
        int levelWhenNext = integer("delay_level_when_next_consume");
        consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
          context.setDelayLevelWhenNextConsume(levelWhenNext);
          return switch (listen(msgs.get(0), instance)) {
            case "CONSUME_SUCCESS" -> ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            case "EXCEPTION" -> throw new IllegalStateException("the scenario's listener throws");
            case "NULL_RETURN" -> null;
            default -> ConsumeConcurrentlyStatus.RECONSUME_LATER;
          };
        });
      }
    }
    consumer.start();
    return consumer;
  }

  /** One delivery: the scenario's outcome for it, after its processing time, recorded. */
  private String listen(MessageExt msg, int instance) {
    long msgId = Long.parseLong(msg.getKeys());
    Listener.Delivery delivery = listener.deliver(msgId, t0);
    // a retry is read from %RETRY%<group>; the client gives it back its own topic
    boolean retried = msg.getProperty(MessageConst.PROPERTY_RETRY_TOPIC) != null;
    deliveries.add(String.join(",", String.valueOf(msgId), String.valueOf(delivery.number()),
        String.valueOf(msg.getReconsumeTimes()), retried ? MixAll.getRetryTopic(group) : topic,
        String.valueOf(msg.getQueueId()), String.valueOf(instance),
        Thread.currentThread().getName(), String.valueOf(msg.getStoreTimestamp() - t0),
        String.valueOf(delivery.startMs()), String.valueOf(System.currentTimeMillis() - t0),
        delivery.outcome()));
    return delivery.outcome();
  }

  /** Until every queue of the topic and of the group's retry topic has one holder. */
  private void waitForRebalance(List<DefaultMQPushConsumer> consumers, int queues)
      throws InterruptedException {
    long deadline = System.currentTimeMillis() + 60_000;
    while (System.currentTimeMillis() < deadline) {
      int held = 0;
      for (DefaultMQPushConsumer consumer : consumers) {
        // an orderly consumer holds a queue once the broker has locked it for it
        held += (int) consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl()
            .getProcessQueueTable().values().stream()
            .filter(queue -> !model.equals("orderly") || queue.isLocked()).count();
      }
      // the topic's queues and %RETRY%<group>'s one (a broadcasting consumer reads no retry
      // topic; each of its instances holds every queue)
      boolean broadcasting = model.equals("broadcasting");
      if (held == (broadcasting ? queues * consumers.size() : queues + 1)) {
        return;
      }
      for (DefaultMQPushConsumer consumer : consumers) {
        // the route, the heartbeat and a rebalance now, not at their 30 s and 20 s ticks
        MQClientInstance client = consumer.getDefaultMQPushConsumerImpl().getmQClientFactory();
        client.updateTopicRouteInfoFromNameServer();
        client.sendHeartbeatToAllBrokerWithLock();
        client.rebalanceImmediately();
      }
      Thread.sleep(200);
    }
    throw new IllegalStateException("the consumers did not settle on the queues in 60 s");
  }

  /**
   * 2,000 messages through a topic and group of their own before production, so that the
   * first messages do not pay for the JVMs' class loading and compilation: the figures are the
   * steady ones.
   */
  private void warmUp(DefaultMQAdminExt admin, String brokerAddr, String namesrvAddr,
      DefaultMQProducer producer, int queues)
      throws Exception {
    admin.createAndUpdateTopicConfig(brokerAddr, new TopicConfig(WARM_UP, queues, queues, 6));
    int rounds = 2_000; // C1 compiles a method after 200 calls, C2 after 5,000 (a batch of 32)
    CountDownLatch consumed = new CountDownLatch(rounds);
    DefaultMQPushConsumer consumer = new DefaultMQPushConsumer(WARM_UP);
    consumer.setNamesrvAddr(namesrvAddr);
    consumer.setInstanceName(WARM_UP);
    consumer.subscribe(WARM_UP, "*");
    consumer.registerMessageListener((MessageListenerConcurrently) (msgs, context) -> {
      msgs.forEach(msg -> consumed.countDown());
      return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
    });
    consumer.start();
    for (int i = 0; i < rounds; i++) {
      sends.send(producer, new Message(WARM_UP, "", String.valueOf(i), new byte[] {1}),
          new MessageQueue(WARM_UP, BROKER, i % queues), model.equals("orderly"));
      if (i % 2 == 1) {
        Listener.sleep(1); // two a millisecond, as a scenario's burst sends
      }
    }
    boolean all = consumed.await(60, TimeUnit.SECONDS);
    check(all, "the warm-up messages were not consumed in 60 s (" + (rounds - consumed.getCount())
        + " of " + rounds + ")");
    consumer.shutdown();
  }

  /**
   * When the consumer's expired-message cleaner runs next (ms since the epoch): the delay of
   * the task ConsumeMessageConcurrentlyService.start scheduled on its executor.
   */
  private static long nextCleanerRun(DefaultMQPushConsumer consumer) throws Exception {
    Object service = consumer.getDefaultMQPushConsumerImpl().getConsumeMessageService();
    Object executor = field(service, "cleanExpireMsgExecutors");
    // Executors.newSingleThreadScheduledExecutor wraps the pool that holds the task
    Object pool = field(executor, "e");
    Delayed next = (Delayed) ((ScheduledThreadPoolExecutor) pool).getQueue().peek();
    return System.currentTimeMillis() + next.getDelay(TimeUnit.MILLISECONDS);
  }

  private static Object field(Object owner, String name) throws ReflectiveOperationException {
    for (Class<?> type = owner.getClass(); type != null; type = type.getSuperclass()) {
      try {
        Field field = type.getDeclaredField(name);
        field.setAccessible(true);
        return field.get(owner);
      } catch (NoSuchFieldException e) {
        // declared further up
      }
    }
    throw new NoSuchFieldException(owner.getClass().getName() + "." + name);
  }

  private void produce(DefaultMQProducer producer, int queues, DefaultMQPushConsumer consumer)
      throws Exception {
    List<String> messages = Files.readAllLines(Path.of(p.getProperty("messages")));
    t0 = System.currentTimeMillis();
    // the cleaner runs every consumeTimeout from its consumer's start; retrysim's periodic
    // check runs at whole multiples of it from t0: t0 is made one of the first consumer's
    if (Long.parseLong(p.getProperty("cleaner_period_ms", "0")) > 0) {
      t0 = nextCleanerRun(consumer);
      System.out.printf("broker4: production waits %d ms for a run of the cleaner%n",
          t0 - System.currentTimeMillis());
      Listener.sleep(t0 - System.currentTimeMillis());
    }
    Files.writeString(out.resolve("t0-ms.txt"), t0 + "\n");
    for (String line : messages) {
      String[] cells = line.split(",");
      Listener.sleep(t0 + Long.parseLong(cells[2]) - System.currentTimeMillis());
      Message message = new Message(topic, "", cells[0], new byte[] {1});
      sends.send(producer, message, new MessageQueue(topic, BROKER, Integer.parseInt(cells[1])),
          model.equals("orderly"));
    }
  }

  /** Waits (a minute at most) for the scraper's out/scrape-ready: run_on_broker's metrics. */
  private void awaitScraper() {
    long deadline = System.currentTimeMillis() + 60_000;
    while (!Files.exists(out.resolve("scrape-ready"))) {
      check(System.currentTimeMillis() < deadline, "metrics: no scrape-ready within 60 s");
      Listener.sleep(50);
    }
  }

  private void writeDeadLetters(String namesrvAddr) throws Exception {
    String dlq = MixAll.getDLQTopic(group);
    List<String> rows = new ArrayList<>();
    DefaultLitePullConsumer reader = new DefaultLitePullConsumer(group + "-dlq-reader");
    reader.setNamesrvAddr(namesrvAddr);
    reader.start();
    try {
      List<MessageQueue> dlqQueues = new ArrayList<>(reader.fetchMessageQueues(dlq));
      reader.assign(dlqQueues);
      for (MessageQueue queue : dlqQueues) {
        reader.seekToBegin(queue);
      }
      for (int empty = 0; empty < 3; ) {
        List<MessageExt> batch = reader.poll(1000);
        empty = batch.isEmpty() ? empty + 1 : 0;
        for (MessageExt msg : batch) {
          rows.add(msg.getKeys() + "," + (msg.getStoreTimestamp() - t0));
        }
      }
    } catch (MQClientException noDeadLetters) {
      // no route to %DLQ%<group>: nothing was dead-lettered
    } finally {
      reader.shutdown();
    }
    Files.write(out.resolve("dlq.csv"), rows);
  }

  /**
   * The store's puts per topic with any: each put is one entry of a consume queue, so the sum
   * of the topic's queues' max offsets. SCHEDULE_TOPIC_XXXX holds level n on queue n - 1, past
   * the 18 queues of its config when the delay table is longer: its levels' queues are read.
   */
  private void writePuts(DefaultMQAdminExt admin) throws Exception {
    int levels = p.getProperty("message_delay_level").trim().split("\\s+").length;
    List<String> rows = new ArrayList<>();
    for (String name : new TreeSet<>(admin.fetchAllTopicList().getTopicList())) {
      long count = 0;
      if (name.equals(TopicValidator.RMQ_SYS_SCHEDULE_TOPIC)) {
        for (int level = 1; level <= levels; level++) {
          count += admin.maxOffset(new MessageQueue(name, BROKER, level - 1));
        }
      } else if (!name.contains(WARM_UP)) {
        for (TopicOffset queue : admin.examineTopicStats(name).getOffsetTable().values()) {
          count += queue.getMaxOffset();
        }
      }
      if (count > 0) {
        rows.add(name + "," + count);
      }
    }
    Files.write(out.resolve("puts.csv"), rows);
  }

  private static void check(boolean ok, String what) {
    if (!ok) {
      throw new IllegalStateException(what);
    }
  }
}
