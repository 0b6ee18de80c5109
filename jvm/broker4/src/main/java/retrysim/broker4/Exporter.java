package retrysim.broker4;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.text.DecimalFormat;
import java.text.DecimalFormatSymbols;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import org.apache.rocketmq.client.consumer.DefaultMQPullConsumer;
import org.apache.rocketmq.client.consumer.PullResult;
import org.apache.rocketmq.client.consumer.PullStatus;
import org.apache.rocketmq.common.MixAll;
import org.apache.rocketmq.common.admin.ConsumeStats;
import org.apache.rocketmq.common.admin.OffsetWrapper;
import org.apache.rocketmq.common.admin.TopicOffset;
import org.apache.rocketmq.common.message.MessageQueue;
import org.apache.rocketmq.common.protocol.body.BrokerStatsData;
import org.apache.rocketmq.common.protocol.body.ClusterInfo;
import org.apache.rocketmq.common.protocol.body.Connection;
import org.apache.rocketmq.common.protocol.body.ConsumerConnection;
import org.apache.rocketmq.common.protocol.heartbeat.MessageModel;
import org.apache.rocketmq.common.protocol.route.BrokerData;
import org.apache.rocketmq.common.protocol.route.TopicRouteData;
import org.apache.rocketmq.store.stats.BrokerStatsManager;
import org.apache.rocketmq.tools.admin.DefaultMQAdminExt;

/**
 * The RocketMQ exporter's series for 4.x (apache/rocketmq-exporter, which Maven Central does not
 * carry), emulated: on each scrape of {@code /metrics} the series are computed from the 4.9.7
 * broker's own statistics through the same admin calls and formulas as the exporter's tasks, and
 * served under its names and labels in its text format (samples only, no HELP or TYPE lines).
 *
 * <p>The citations are to that repository at e1ab2dd569d4 (MetricsCollectTask: {@code
 * src/main/java/org/apache/rocketmq/exporter/task/MetricsCollectTask.java}; the collector:
 * {@code .../exporter/collector/RMQMetricsCollector.java}). Two differences, both of timing: the
 * exporter runs its tasks once a minute (application.yml, cron {@code 15 0/1 * * * ?}) and serves
 * what the last run put in its caches, which keep a series 60 s after its last update; here every
 * scrape runs them, and serves only what this run found. Left out: the broker's runtime table,
 * the producers' and the clients' runtime series (the client metric task).
 */
final class Exporter implements AutoCloseable {
  static final String NAME = "rocketmq-exporter"; // its line in metrics-endpoints.txt

  private final DefaultMQAdminExt admin = new DefaultMQAdminExt();
  // MQAdminExtImpl.queryMsgByOffset's pull consumer (MQAdminInstance.buildPullConsumer)
  private final DefaultMQPullConsumer pull = new DefaultMQPullConsumer(MixAll.TOOLS_CONSUMER_GROUP);
  private final HttpServer server;
  private final Map<String, List<String>> families = new LinkedHashMap<>();

  /** Serving on a free loopback port; its URL written to {@code endpoints} once it is up. */
  Exporter(String namesrvAddr, Path endpoints) throws Exception {
    admin.setNamesrvAddr(namesrvAddr);
    admin.setInstanceName("retrysim-exporter");
    admin.start();
    pull.setNamesrvAddr(namesrvAddr);
    pull.setInstanceName("retrysim-exporter-pull");
    pull.start();
    pull.getDefaultMQPullConsumerImpl().getPullAPIWrapper().setConnectBrokerByUser(true);
    server = HttpServer.create(new InetSocketAddress(InetAddress.getLoopbackAddress(), 0), 0);
    server.createContext("/metrics", this::scrape);
    server.start(); // one dispatcher thread: one scrape at a time
    String url = "http://127.0.0.1:" + server.getAddress().getPort() + "/metrics";
    Path written = Files.writeString(endpoints.resolveSibling(endpoints.getFileName() + ".tmp"),
        NAME + " " + url + "\n");
    Files.move(written, endpoints, StandardCopyOption.ATOMIC_MOVE);
  }

  @Override
  public void close() {
    server.stop(0);
    pull.shutdown();
    admin.shutdown();
  }

  private void scrape(HttpExchange exchange) throws IOException {
    byte[] body;
    synchronized (families) {
      families.clear();
      try {
        collect();
      } catch (Exception e) { // the namesrv's list or the cluster's info: the exporter logs it
        System.err.println("broker4 exporter: " + e);
      }
      StringBuilder text = new StringBuilder();
      families.values().forEach(lines -> lines.forEach(line -> text.append(line).append('\n')));
      body = text.toString().getBytes(StandardCharsets.UTF_8);
    }
    // RMQMetricsController.metrics: the exporter's content type
    exchange.getResponseHeaders().set("Content-Type", "text/plain; version=0.0.4; charset=utf-8");
    exchange.sendResponseHeaders(200, body.length);
    try (OutputStream out = exchange.getResponseBody()) {
      out.write(body);
    }
  }

  private void collect() throws Exception {
    // the families in the order RMQMetricsCollector.collect (l. 400-420) lists them; a family
    // with no samples writes nothing (RMQMetricsServiceImpl.writeEscapedHelp)
    for (String name : new String[] {"rocketmq_group_diff", "rocketmq_group_retrydiff",
        "rocketmq_group_dlqdiff", "rocketmq_group_count", "rocketmq_producer_offset",
        "rocketmq_topic_retry_offset", "rocketmq_topic_dlq_offset", "rocketmq_producer_tps",
        "rocketmq_producer_message_size", "rocketmq_consumer_tps", "rocketmq_consumer_offset",
        "rocketmq_consumer_message_size", "rocketmq_send_back_nums",
        "rocketmq_group_get_latency_by_storetime", "rocketmq_broker_tps", "rocketmq_broker_qps"}) {
      families.put(name, new ArrayList<>());
    }
    ClusterInfo clusterInfo = admin.examineBrokerClusterInfo();
    // MetricsCollectTask.init (l. 124-131): the first cluster's name, used by the offset tasks
    String cluster = clusterInfo.getClusterAddrTable().keySet().iterator().next();
    Set<String> topics = admin.fetchAllTopicList().getTopicList();
    topicOffsets(cluster, topics);
    consumerOffsets(cluster, topics);
    brokerStatsTopic(clusterInfo, topics);
    brokerStats(clusterInfo);
  }

  /**
   * MetricsCollectTask.collectTopicOffset (l. 142-204): examineTopicStats per topic, the sum of
   * its queues' max offsets per broker. RMQMetricsCollector.addTopicOffsetMetric (l. 685-693)
   * files a %RETRY% topic under rocketmq_topic_retry_offset, a %DLQ% one under
   * rocketmq_topic_dlq_offset with its group (the topic less %DLQ%) as the label, the rest under
   * rocketmq_producer_offset; labels l. 329-335.
   */
  private void topicOffsets(String cluster, Set<String> topics) {
    for (String topic : topics) {
      Map<String, Long> offsets = new HashMap<>();
      try {
        for (Map.Entry<MessageQueue, TopicOffset> entry :
            admin.examineTopicStats(topic).getOffsetTable().entrySet()) {
          offsets.merge(entry.getKey().getBrokerName(), entry.getValue().getMaxOffset(), Long::sum);
        }
      } catch (Exception e) {
        continue; // l. 168-173
      }
      offsets.forEach((broker, offset) -> {
        if (topic.startsWith(MixAll.RETRY_GROUP_TOPIC_PREFIX)) {
          add("rocketmq_topic_retry_offset", offset, "cluster", cluster, "broker", broker,
              "topic", topic);
        } else if (topic.startsWith(MixAll.DLQ_GROUP_TOPIC_PREFIX)) {
          add("rocketmq_topic_dlq_offset", offset, "cluster", cluster, "broker", broker,
              "group", topic.replace(MixAll.DLQ_GROUP_TOPIC_PREFIX, ""));
        } else {
          add("rocketmq_producer_offset", offset, "cluster", cluster, "broker", broker,
              "topic", topic);
        }
      });
    }
  }

  /**
   * MetricsCollectTask.collectConsumerOffset (l. 254-420): for each topic but a %DLQ% one, each
   * group queryTopicConsumeByWho names; its online consumers (examineConsumerConnectionInfo)
   * and examineConsumeStats(group, topic).
   */
  private void consumerOffsets(String cluster, Set<String> topics) {
    for (String topic : topics) {
      if (topic.startsWith(MixAll.DLQ_GROUP_TOPIC_PREFIX)) {
        continue; // l. 275-278: so rocketmq_group_dlqdiff never has a sample
      }
      Set<String> groups;
      try {
        groups = admin.queryTopicConsumeByWho(topic).getGroupList();
      } catch (Exception e) {
        continue;
      }
      if (groups == null) {
        continue;
      }
      for (String group : groups) {
        ConsumerConnection online = null;
        MessageModel model = MessageModel.CLUSTERING;
        try {
          online = admin.examineConsumerConnectionInfo(group);
          if (online.getMessageModel() != null) {
            model = online.getMessageModel();
          }
        } catch (Exception e) {
          // l. 304-310: no consumer online (CONSUMER_NOT_ONLINE): none counted
        }
        int count = online == null || online.getConnectionSet() == null
            ? 0 : online.getConnectionSet().size();
        List<String> addrs = new ArrayList<>();
        List<String> ids = new ArrayList<>();
        if (count > 0) { // l. 317-325 and buildClientAddresses, l. 753-767
          for (Connection connection : online.getConnectionSet()) {
            addrs.add(connection.getClientAddr());
            ids.add(connection.getClientId());
          }
        }
        add("rocketmq_group_count", count, "caddr", String.join(",", addrs),
            "localaddr", String.join(",", ids), "group", group);
        ConsumeStats stats;
        try {
          stats = admin.examineConsumeStats(group, topic);
        } catch (Exception e) {
          continue; // l. 339-349
        }
        if (stats == null || stats.getOffsetTable() == null || stats.getOffsetTable().isEmpty()) {
          continue;
        }
        if (model == MessageModel.CLUSTERING) {
          // l. 350-361, RMQMetricsCollector.addGroupDiffMetric (l. 703-711): the sum over the
          // queues of the broker's offset less the group's; labels l. 280
          String family = topic.startsWith(MixAll.RETRY_GROUP_TOPIC_PREFIX)
              ? "rocketmq_group_retrydiff" : "rocketmq_group_diff";
          add(family, stats.computeTotalDiff(), "group", group, "topic", topic,
              "countOfOnlineConsumers", String.valueOf(count),
              "msgModel", String.valueOf(model.ordinal()));
        }
        // l. 362-380: the group's offsets summed per broker (labels l. 518-520)
        Map<String, Long> consumed = new HashMap<>();
        stats.getOffsetTable().forEach((queue, offset) ->
            consumed.merge(queue.getBrokerName(), offset.getConsumerOffset(), Long::sum));
        consumed.forEach((broker, offset) -> add("rocketmq_consumer_offset", offset,
            "cluster", cluster, "broker", broker, "topic", topic, "group", group));
        if (model == MessageModel.CLUSTERING) {
          latency(cluster, topic, group, stats);
        }
      }
    }
  }

  /**
   * l. 382-416: per broker, the largest over its queues of now less the store time of the
   * message at the group's offset (pulled with MQAdminExtImpl.queryMsgByOffset, l. 103-105),
   * 0 for a queue the group is at the end of; past the queue's start, its first message's.
   * Labels RMQMetricsCollector l. 482-484.
   */
  private void latency(String cluster, String topic, String group, ConsumeStats stats) {
    Map<String, Long> latencies = new HashMap<>();
    try {
      for (Map.Entry<MessageQueue, OffsetWrapper> entry : stats.getOffsetTable().entrySet()) {
        MessageQueue queue = entry.getKey();
        OffsetWrapper offset = entry.getValue();
        PullResult found = pull.pull(queue, "*", offset.getConsumerOffset(), 1);
        long lag = 0;
        if (found != null && found.getPullStatus() == PullStatus.FOUND) {
          lag = System.currentTimeMillis() - found.getMsgFoundList().get(0).getStoreTimestamp();
          if (offset.getBrokerOffset() == offset.getConsumerOffset()) {
            lag = 0;
          }
        } else if (found.getPullStatus() == PullStatus.OFFSET_ILLEGAL) {
          PullResult first = pull.pull(queue, "*", found.getMinOffset(), 1);
          if (first != null && first.getPullStatus() == PullStatus.FOUND) {
            lag = System.currentTimeMillis() - first.getMsgFoundList().get(0).getStoreTimestamp();
          }
        }
        String broker = queue.getBrokerName();
        if (!latencies.containsKey(broker)) {
          latencies.put(broker, Math.max(lag, 0));
        } else if (lag > latencies.get(broker)) {
          latencies.put(broker, lag);
        }
      }
    } catch (Exception e) {
      return; // l. 413-415: the group's latency left out of this run
    }
    latencies.forEach((broker, lag) -> add("rocketmq_group_get_latency_by_storetime", lag,
        "cluster", cluster, "broker", broker, "topic", topic, "group", group));
  }

  /**
   * MetricsCollectTask.collectBrokerStatsTopic (l. 422-585): for each topic but a %RETRY% or
   * %DLQ% one, the broker's minute statistics (viewBrokerStatsData; StatsItem's last minute,
   * sampled every 10 s): TOPIC_PUT_NUMS and TOPIC_PUT_SIZE by topic, then GROUP_GET_NUMS,
   * GROUP_GET_SIZE (their tps to two decimals, Utils.getFixedDouble) and SNDBCK_PUT_NUMS (its
   * sum) by {@code topic@group} for each group queryTopicConsumeByWho names. A statistic the
   * broker does not have yet (SYSTEM_ERROR) is left out. Labels RMQMetricsCollector l. 518-520
   * and l. 672.
   */
  private void brokerStatsTopic(ClusterInfo clusterInfo, Set<String> topics) {
    for (String topic : topics) {
      if (topic.startsWith(MixAll.RETRY_GROUP_TOPIC_PREFIX)
          || topic.startsWith(MixAll.DLQ_GROUP_TOPIC_PREFIX)) {
        continue;
      }
      TopicRouteData route;
      try {
        route = admin.examineTopicRouteInfo(topic);
      } catch (Exception e) {
        continue;
      }
      for (BrokerData broker : route.getBrokerDatas()) {
        String master = broker.getBrokerAddrs().get(MixAll.MASTER_ID);
        if (master == null || master.isBlank()) {
          continue;
        }
        String[] labels = {"cluster", broker.getCluster(), "broker", broker.getBrokerName(),
            "topic", topic};
        tps("rocketmq_producer_tps", master, BrokerStatsManager.TOPIC_PUT_NUMS, topic, labels);
        tps("rocketmq_producer_message_size", master, BrokerStatsManager.TOPIC_PUT_SIZE, topic,
            labels);
      }
      Set<String> groups;
      try {
        groups = admin.queryTopicConsumeByWho(topic).getGroupList();
      } catch (Exception e) {
        continue;
      }
      for (String group : groups == null ? Set.<String>of() : groups) {
        for (BrokerData broker : route.getBrokerDatas()) {
          String master = broker.getBrokerAddrs().get(MixAll.MASTER_ID);
          if (master == null) {
            continue;
          }
          String key = String.format("%s@%s", topic, group);
          String[] labels = {"cluster", broker.getCluster(), "broker", broker.getBrokerName(),
              "topic", topic, "group", group};
          tps("rocketmq_consumer_tps", master, BrokerStatsManager.GROUP_GET_NUMS, key, labels);
          tps("rocketmq_consumer_message_size", master, BrokerStatsManager.GROUP_GET_SIZE, key,
              labels);
          BrokerStatsData sendBack = stats(master, BrokerStatsManager.SNDBCK_PUT_NUMS, key);
          if (sendBack != null) {
            add("rocketmq_send_back_nums", sendBack.getStatsMinute().getSum(), labels);
          }
        }
      }
    }
  }

  /**
   * MetricsCollectTask.collectBrokerStats (l. 587-647): BROKER_PUT_NUMS and BROKER_GET_NUMS by
   * cluster name on each master, as rocketmq_broker_tps and rocketmq_broker_qps (labels
   * RMQMetricsCollector l. 486).
   */
  private void brokerStats(ClusterInfo clusterInfo) {
    for (BrokerData broker : clusterInfo.getBrokerAddrTable().values()) {
      String master = broker.getBrokerAddrs().get(MixAll.MASTER_ID);
      if (master == null || master.isBlank()) {
        continue;
      }
      String[] labels = {"cluster", broker.getCluster(), "brokerIP", master,
          "broker", broker.getBrokerName()};
      tps("rocketmq_broker_tps", master, BrokerStatsManager.BROKER_PUT_NUMS, broker.getCluster(),
          labels);
      tps("rocketmq_broker_qps", master, BrokerStatsManager.BROKER_GET_NUMS, broker.getCluster(),
          labels);
    }
  }

  private void tps(String family, String master, String statsName, String key, String[] labels) {
    BrokerStatsData data = stats(master, statsName, key);
    if (data != null) {
      add(family, fixed(data.getStatsMinute().getTps()), labels);
    }
  }

  private BrokerStatsData stats(String master, String statsName, String key) {
    try {
      return admin.viewBrokerStatsData(master, statsName, key);
    } catch (Exception e) {
      return null; // "The stats <name> <key> not exist" (SYSTEM_ERROR), or a failed call
    }
  }

  /** Utils.getFixedDouble: two decimals, half-even ({@code #.##}); a root locale's digits. */
  private static double fixed(double value) {
    if (!Double.isFinite(value)) {
      return value; // none: a statistic's minute always spans 10 s or more (StatsItem)
    }
    return Double.parseDouble(
        new DecimalFormat("#.##", DecimalFormatSymbols.getInstance(Locale.ROOT)).format(value));
  }

  /**
   * One sample as RMQMetricsServiceImpl.writeEscapedHelp writes it: {@code name{k="v",} value},
   * the value as Collector.doubleToGoString writes it.
   */
  private void add(String family, double value, String... labels) {
    StringBuilder line = new StringBuilder(family).append('{');
    for (int i = 0; i < labels.length; i += 2) {
      line.append(labels[i]).append("=\"").append(labels[i + 1].replace("\\", "\\\\")
          .replace("\"", "\\\"").replace("\n", "\\n")).append("\",");
    }
    line.append("} ");
    if (Double.isNaN(value)) {
      line.append("NaN");
    } else if (Double.isInfinite(value)) {
      line.append(value > 0 ? "+Inf" : "-Inf");
    } else {
      line.append(value);
    }
    families.get(family).add(line.toString());
  }
}
