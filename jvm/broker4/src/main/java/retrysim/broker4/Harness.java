package retrysim.broker4;

import java.io.FileReader;
import java.io.IOException;
import java.io.PrintWriter;
import java.net.ServerSocket;
import java.nio.file.Files;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.rocketmq.broker.BrokerController;
import org.apache.rocketmq.client.consumer.DefaultLitePullConsumer;
import org.apache.rocketmq.client.consumer.DefaultMQPushConsumer;
import org.apache.rocketmq.client.consumer.listener.ConsumeConcurrentlyStatus;
import org.apache.rocketmq.client.consumer.listener.MessageListenerConcurrently;
import org.apache.rocketmq.client.exception.MQClientException;
import org.apache.rocketmq.client.impl.factory.MQClientInstance;
import org.apache.rocketmq.client.producer.DefaultMQProducer;
import org.apache.rocketmq.common.BrokerConfig;
import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.common.TopicConfig;
import org.apache.rocketmq.common.message.Message;
import org.apache.rocketmq.common.message.MessageConst;
import org.apache.rocketmq.common.message.MessageExt;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.namesrv.NamesrvConfig;
import org.apache.rocketmq.namesrv.NamesrvController;
import org.apache.rocketmq.remoting.netty.NettyClientConfig;
import org.apache.rocketmq.remoting.netty.NettyServerConfig;
import org.apache.rocketmq.store.DefaultMessageStore;
import org.apache.rocketmq.store.config.MessageStoreConfig;

/**
 * One scenario on a real 4.9.7 namesrv and broker, consumed by the official push consumer.
 *
 * <p>Args: a properties file (written by retrysim.conformance) and an output folder. The
 * messages (msg_id, queue_id, born_ms) and each delivery's outcome and processing time (by
 * msg_id and delivery number, drawn by retrysim) are CSV files it names. Production starts
 * once every consumer holds its queues; every delivery is written to deliveries.csv, the
 * DLQ's messages to dlq.csv and the store's puts per topic to puts.csv.
 */
public final class Harness {
  private static final String GROUP_KEY = "group";
  private static final String WARM_UP = "retrysim-warm-up";

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
      System.exit(status); // the clients' and the broker's non-daemon threads
    }
  }

  private final Properties p;
  private final Path out;
  private final String topic;
  private final String group;
  private final ConcurrentLinkedQueue<String> deliveries = new ConcurrentLinkedQueue<>();
  private final Map<Long, AtomicInteger> seen = new ConcurrentHashMap<>();
  private final Map<String, String[]> outcomes = new HashMap<>();
  private volatile long t0 = Long.MAX_VALUE;

  private Harness(Properties p, Path out) {
    this.p = p;
    this.out = out;
    this.topic = p.getProperty("topic");
    this.group = p.getProperty(GROUP_KEY);
  }

  private int integer(String key) {
    return Integer.parseInt(p.getProperty(key));
  }

  private static int freePort() throws IOException {
    try (ServerSocket socket = new ServerSocket(0)) {
      return socket.getLocalPort();
    }
  }

  private void run() throws Exception {
    for (String line : Files.readAllLines(Path.of(p.getProperty("outcomes")))) {
      String[] cells = line.split(",");
      outcomes.put(cells[0] + "/" + cells[1], cells);
    }
    Path store = Files.createTempDirectory("retrysim-broker4-");
    NettyServerConfig nsNetty = new NettyServerConfig();
    nsNetty.setListenPort(freePort());
    NamesrvController namesrv = new NamesrvController(new NamesrvConfig(), nsNetty);
    check(namesrv.initialize(), "the namesrv did not initialize");
    namesrv.start();
    String namesrvAddr = "127.0.0.1:" + nsNetty.getListenPort();
    BrokerConfig brokerConfig = new BrokerConfig();
    brokerConfig.setBrokerName("broker-a");
    brokerConfig.setBrokerIP1("127.0.0.1");
    brokerConfig.setNamesrvAddr(namesrvAddr);
    NettyServerConfig brokerNetty = new NettyServerConfig();
    brokerNetty.setListenPort(freePort());
    MessageStoreConfig storeConfig = new MessageStoreConfig();
    storeConfig.setStorePathRootDir(store.toString());
    storeConfig.setStorePathCommitLog(store.resolve("commitlog").toString());
    storeConfig.setMappedFileSizeCommitLog(64 << 20);
    storeConfig.setMappedFileSizeConsumeQueue(300_000 * 20);
    storeConfig.setMessageDelayLevel(p.getProperty("message_delay_level"));
    storeConfig.setHaListenPort(freePort()); // not the fixed 10912: runs side by side
    BrokerController broker =
        new BrokerController(brokerConfig, brokerNetty, new NettyClientConfig(), storeConfig);
    check(broker.initialize(), "the broker did not initialize (store " + store + ")");
    broker.start();
    int queues = integer("queues");
    broker.getTopicConfigManager().updateTopicConfig(new TopicConfig(topic, queues, queues, 6));
    broker.registerBrokerAll(true, false, true);

    List<DefaultMQPushConsumer> consumers = new ArrayList<>();
    for (int i = 0; i < integer("instances"); i++) {
      consumers.add(consumer(namesrvAddr, i));
    }
    DefaultMQProducer producer = new DefaultMQProducer(group + "-producer");
    producer.setNamesrvAddr(namesrvAddr);
    producer.start();
    waitForRebalance(consumers, queues);
    warmUp(broker, namesrvAddr, producer, queues);
    produce(producer, queues);
    long horizon = Long.parseLong(p.getProperty("horizon_ms"));
    Thread.sleep(Math.max(0, t0 + horizon - System.currentTimeMillis()));
    for (DefaultMQPushConsumer consumer : consumers) {
      consumer.shutdown();
    }
    producer.shutdown();
    Files.write(out.resolve("deliveries.csv"), deliveries);
    writeDeadLetters(namesrvAddr);
    writePuts((DefaultMessageStore) broker.getMessageStore());
    broker.shutdown();
    namesrv.shutdown();
    deleteTree(store);
  }

  private static void deleteTree(Path root) throws IOException {
    try (var paths = Files.walk(root)) {
      for (Path path : paths.sorted(java.util.Comparator.reverseOrder()).toList()) {
        Files.deleteIfExists(path);
      }
    }
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
    // at the horizon, the listeners still running finish and are recorded (retrysim counts a
    // delivery from its start)
    consumer.setAwaitTerminationMillisWhenShutdown(Long.parseLong(p.getProperty("await_ms")));
    consumer.subscribe(topic, "*");
    int levelWhenNext = integer("delay_level_when_next_consume");
    MessageListenerConcurrently listener =
        (msgs, context) -> {
          context.setDelayLevelWhenNextConsume(levelWhenNext);
          MessageExt msg = msgs.get(0);
          long msgId = Long.parseLong(msg.getKeys());
          int delivery = seen.computeIfAbsent(msgId, id -> new AtomicInteger()).incrementAndGet();
          String[] outcome = outcomes.get(msgId + "/" + delivery);
          String kind = outcome == null ? "CONSUME_SUCCESS" : outcome[2];
          long processing = outcome == null ? 0 : Long.parseLong(outcome[3]);
          long start = System.currentTimeMillis() - t0;
          sleep(processing);
          // a retry is read from %RETRY%<group>; the client gives it back its own topic
          boolean retried = msg.getProperty(MessageConst.PROPERTY_RETRY_TOPIC) != null;
          deliveries.add(String.join(",", String.valueOf(msgId), String.valueOf(delivery),
              String.valueOf(msg.getReconsumeTimes()), retried ? MixAll.getRetryTopic(group) : topic,
              String.valueOf(msg.getQueueId()), String.valueOf(instance),
              Thread.currentThread().getName(), String.valueOf(msg.getStoreTimestamp() - t0),
              String.valueOf(start),
              String.valueOf(System.currentTimeMillis() - t0), kind));
          switch (kind) {
            case "CONSUME_SUCCESS":
              return ConsumeConcurrentlyStatus.CONSUME_SUCCESS;
            case "EXCEPTION":
              throw new IllegalStateException("the scenario's listener throws");
            case "NULL_RETURN":
              return null;
            default:
              return ConsumeConcurrentlyStatus.RECONSUME_LATER;
          }
        };
    consumer.registerMessageListener(listener);
    consumer.start();
    return consumer;
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

  /** Until every queue of the topic and of the group's retry topic has one holder. */
  private void waitForRebalance(List<DefaultMQPushConsumer> consumers, int queues)
      throws InterruptedException {
    long deadline = System.currentTimeMillis() + 60_000;
    while (System.currentTimeMillis() < deadline) {
      int held = 0;
      for (DefaultMQPushConsumer consumer : consumers) {
        held += consumer.getDefaultMQPushConsumerImpl().getRebalanceImpl()
            .getProcessQueueTable().size();
      }
      if (held == queues + 1) { // the topic's queues and %RETRY%<group>'s one
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
   * A round trip on a topic of its own before production, so that the first messages do not
   * pay for the JVM's class loading and compilation: the figures are the steady ones.
   */
  private void warmUp(BrokerController broker, String namesrvAddr, DefaultMQProducer producer,
      int queues)
      throws Exception {
    broker.getTopicConfigManager()
        .updateTopicConfig(new TopicConfig(WARM_UP, queues, queues, 6));
    broker.registerBrokerAll(true, false, true);
    int rounds = 50;
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
      producer.send(new Message(WARM_UP, "", String.valueOf(i), new byte[] {1}),
          new MessageQueue(WARM_UP, "broker-a", i % queues));
      sleep(10);
    }
    check(consumed.await(60, TimeUnit.SECONDS),
        "the warm-up messages were not consumed in 60 s");
    consumer.shutdown();
  }

  private void produce(DefaultMQProducer producer, int queues) throws Exception {
    List<String> messages = Files.readAllLines(Path.of(p.getProperty("messages")));
    t0 = System.currentTimeMillis();
    for (String line : messages) {
      String[] cells = line.split(",");
      sleep(t0 + Long.parseLong(cells[2]) - System.currentTimeMillis());
      Message message = new Message(topic, "", cells[0], new byte[] {1});
      producer.send(message, new MessageQueue(topic, "broker-a", Integer.parseInt(cells[1])));
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

  private void writePuts(DefaultMessageStore store) throws IOException {
    try (PrintWriter puts = new PrintWriter(Files.newBufferedWriter(out.resolve("puts.csv")))) {
      store.getStoreStatsService().getPutMessageTopicTimesTotal()
          .forEach((name, count) -> {
            if (!name.contains(WARM_UP)) {
              puts.println(name + "," + count.sum());
            }
          });
    }
  }

  private static void check(boolean ok, String what) {
    if (!ok) {
      throw new IllegalStateException(what);
    }
  }
}
