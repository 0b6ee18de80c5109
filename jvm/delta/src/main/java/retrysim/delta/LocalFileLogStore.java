package retrysim.delta;

import io.delta.storage.HadoopFileSystemLogStore;
import java.io.IOException;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.nio.file.FileAlreadyExistsException;
import java.nio.file.Files;
import java.nio.file.Paths;
import java.nio.file.StandardCopyOption;
import java.nio.file.StandardOpenOption;
import java.util.Iterator;
import java.util.UUID;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Path;

/**
 * Delta's log store for {@code file:} tables, writing each commit with java.nio.
 *
 * <p>Why: without Hadoop's native library, its local file system runs a process for every
 * {@code chmod} and {@code readlink}; Delta's default store for {@code file:} (HDFSLogStore)
 * paid about 20 of them per commit, 10-17 ms each. Here a commit is a file written beside its
 * target and hard-linked to the target's name: the link fails if the version exists, so of two
 * writers (in any processes) exactly one commits a version, which is the put-if-absent Delta's
 * optimistic concurrency needs. Reads and listings stay Hadoop's.
 */
public class LocalFileLogStore extends HadoopFileSystemLogStore {

  public LocalFileLogStore(Configuration conf) {
    super(conf);
  }

  @Override
  public void write(Path path, Iterator<String> actions, Boolean overwrite, Configuration conf)
      throws IOException {
    java.nio.file.Path target = Paths.get(path.getFileSystem(conf).makeQualified(path).toUri());
    Files.createDirectories(target.getParent());
    java.nio.file.Path temp =
        target.resolveSibling("." + target.getFileName() + "." + UUID.randomUUID() + ".tmp");
    try {
      try (OutputStream out = Files.newOutputStream(temp, StandardOpenOption.CREATE_NEW)) {
        while (actions.hasNext()) {
          out.write((actions.next() + "\n").getBytes(StandardCharsets.UTF_8));
        }
      }
      if (overwrite) {
        Files.move(temp, target, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
      } else {
        publish(temp, target);
      }
    } finally {
      Files.deleteIfExists(temp);
    }
  }

  /** The target appears whole or not at all, and never replaces an existing one. */
  private static void publish(java.nio.file.Path temp, java.nio.file.Path target)
      throws IOException {
    try {
      Files.createLink(target, temp);
    } catch (FileAlreadyExistsException e) {
      throw e;
    } catch (UnsupportedOperationException | IOException e) {
      // no hard links here (some mounted file systems): a rename that refuses an existing
      // target, as Hadoop's own store does (a check, then the rename)
      Files.move(temp, target);
    }
  }

  @Override
  public Boolean isPartialWriteVisible(Path path, Configuration conf) {
    return false;
  }
}
